package node

import (
	"errors"
	"fmt"
	"strings"
	"time"
)

// zeroMeans is what an offFlag makes of "0". It differs by flag, on
// purpose: a zero yield is no waiting, but a zero rate or a zero release
// budget would be a setting nobody wants, and "0" for the anti-entropy
// period has always meant the default. The help text of each flag says
// which.
type zeroMeans int

const (
	// zeroRefused: "0" is an error; the flag takes a positive value,
	// "off" or "".
	zeroRefused zeroMeans = iota
	// zeroIsOff: "0" is the same as "off".
	zeroIsOff
	// zeroIsDefault: "0" is the same as "" (the default).
	zeroIsDefault
)

// offFlag is a kvmeshd setting that takes a positive quantity (a byte
// size, a rate or a duration), "off", or "" for the default, in flags and
// in the JSON file alike. Every such setting is parsed here so the words
// mean the same everywhere; what "off" gives, and what "0" means, is per
// flag (off, zero) and stated in its help text (usage).
type offFlag struct {
	name string
	// kind is how a value is read: offBytes or offDuration.
	kind offKind
	// off is the configuration value "off" stands for: -1 where the
	// consumer reads a negative value as off, 0 where zero is its off.
	off int64
	// offDoc says what "off" does, for the help text.
	offDoc string
	zero   zeroMeans
}

// offKind is how an offFlag reads a positive value.
type offKind int

const (
	offBytes    offKind = iota // ParseBytes (a size, or bytes per second)
	offDuration                // time.ParseDuration
)

// errOffFlag is wrapped by every offFlag parse error.
var errOffFlag = errors.New("kvmeshd: bad setting")

// parse reads s: "" (and "0" for zeroIsDefault) gives 0, the consumer's
// default; "off" (and "0" for zeroIsOff) gives f.off; else a positive
// value.
func (f offFlag) parse(s string) (int64, error) {
	v := strings.TrimSpace(s)
	switch {
	case v == "":
		return 0, nil
	case v == "off":
		return f.off, nil
	case v == "0" && f.zero == zeroIsOff:
		return f.off, nil
	case v == "0" && f.zero == zeroIsDefault:
		return 0, nil
	}
	var n int64
	var err error
	switch f.kind {
	case offDuration:
		var d time.Duration
		d, err = time.ParseDuration(v)
		n = int64(d)
	default:
		n, err = ParseBytes(v)
	}
	if err != nil || n <= 0 {
		return 0, fmt.Errorf("%w: -%s %q: %s", errOffFlag, f.name, s, f.want())
	}
	return n, nil
}

// duration is parse for a duration setting.
func (f offFlag) duration(s string) (time.Duration, error) {
	n, err := f.parse(s)
	return time.Duration(n), err
}

// want says what the flag accepts, for errors.
func (f offFlag) want() string {
	unit := "a positive byte size"
	if f.kind == offDuration {
		unit = "a positive duration"
	}
	return unit + ` or "off"`
}

// usage is the help text of the flag: what, then what "off" and "0" do.
func (f offFlag) usage(what string) string {
	var zero string
	switch f.zero {
	case zeroIsOff:
		zero = `"0" is "off"`
	case zeroIsDefault:
		zero = `"0" is the default`
	default:
		zero = `"0" is refused`
	}
	return fmt.Sprintf(`%s; "off": %s; %s`, what, f.offDoc, zero)
}

// The offFlags of kvmeshd. Functions, not variables: the package keeps no
// globals.

func dramReleaseFlag() offFlag {
	return offFlag{name: "dram-release", kind: offBytes, off: -1, offDoc: "never (freed pages stay resident)", zero: zeroRefused}
}

func antiEntropyFlag() offFlag {
	return offFlag{name: "anti-entropy", kind: offDuration, off: -1, offDoc: "no rounds", zero: zeroIsDefault}
}

func rebalanceRateFlag() offFlag {
	return offFlag{name: "rebalance-rate", kind: offBytes, off: -1, offDoc: "unlimited", zero: zeroRefused}
}

func rebalanceRecvRateFlag() offFlag {
	return offFlag{name: "rebalance-recv-rate", kind: offBytes, off: 0, offDoc: "uncapped", zero: zeroRefused}
}

func rebalanceYieldFlag() offFlag {
	return offFlag{name: "rebalance-yield", kind: offDuration, off: -1, offDoc: "no waiting", zero: zeroIsOff}
}
