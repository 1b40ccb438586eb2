package main

import (
	"fmt"
	"strconv"
	"strings"

	"github.com/kvmesh/kvmesh/chunk"
)

// parseID reads a 32-digit hex ID as chunk.ID.String writes it (Hi, Lo).
func parseID(s string) (chunk.ID, error) {
	if len(s) != 32 {
		return chunk.ID{}, fmt.Errorf("id %q: want 32 hex digits", s)
	}
	hi, err := strconv.ParseUint(s[:16], 16, 64)
	if err != nil {
		return chunk.ID{}, fmt.Errorf("id %q: %w", s, err)
	}
	lo, err := strconv.ParseUint(s[16:], 16, 64)
	if err != nil {
		return chunk.ID{}, fmt.Errorf("id %q: %w", s, err)
	}
	return chunk.ID{Lo: lo, Hi: hi}, nil
}

func parseFingerprint(s string) (chunk.Fingerprint, error) {
	id, err := parseID(s)
	return chunk.Fingerprint(id), err
}

// parseContext reads a context as chunk.Context.String writes it:
// "standalone", "window(W):ID" or "prefix:ID".
func parseContext(s string) (chunk.Context, error) {
	switch {
	case s == "standalone" || s == "":
		return chunk.StandaloneContext(), nil
	case strings.HasPrefix(s, "prefix:"):
		id, err := parseID(strings.TrimPrefix(s, "prefix:"))
		return chunk.PrefixContext(id), err
	case strings.HasPrefix(s, "window("):
		w, ids, ok := strings.Cut(strings.TrimPrefix(s, "window("), "):")
		if !ok {
			break
		}
		n, err := strconv.ParseUint(w, 10, 32)
		if err != nil {
			return chunk.Context{}, fmt.Errorf("context %q: %w", s, err)
		}
		id, err := parseID(ids)
		return chunk.Context{Kind: chunk.ContextWindow, Window: uint32(n), ID: id}, err
	}
	return chunk.Context{}, fmt.Errorf("context %q: want standalone, window(W):ID or prefix:ID", s)
}

// parseKey reads a key as chunk.Key.String writes it:
// FINGERPRINT/CONTENT/CONTEXT.
func parseKey(s string) (chunk.Key, error) {
	parts := strings.SplitN(s, "/", 3)
	if len(parts) != 3 {
		return chunk.Key{}, fmt.Errorf("key %q: want FINGERPRINT/CONTENT/CONTEXT", s)
	}
	fp, err := parseFingerprint(parts[0])
	if err != nil {
		return chunk.Key{}, err
	}
	content, err := parseID(parts[1])
	if err != nil {
		return chunk.Key{}, err
	}
	ctx, err := parseContext(parts[2])
	if err != nil {
		return chunk.Key{}, err
	}
	return chunk.Key{Fingerprint: fp, Content: content, Context: ctx}, nil
}

// parseSpan reads "A:B" as [A, B); "" is the zero span (everything).
func parseSpan(s string) (lo, hi int, err error) {
	if s == "" {
		return 0, 0, nil
	}
	a, b, ok := strings.Cut(s, ":")
	if !ok {
		return 0, 0, fmt.Errorf("span %q: want A:B", s)
	}
	if lo, err = strconv.Atoi(a); err != nil {
		return 0, 0, fmt.Errorf("span %q: %w", s, err)
	}
	if hi, err = strconv.Atoi(b); err != nil {
		return 0, 0, fmt.Errorf("span %q: %w", s, err)
	}
	return lo, hi, nil
}
