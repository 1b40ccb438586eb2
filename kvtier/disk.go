package kvtier

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"time"

	"github.com/kvmesh/kvmesh/chunk"
)

// diskDir is the disk tier's file layout: one file per entry under one of
// 256 subdirectories (by the content ID's low byte), named by the key, the
// checksum and size of the blob as it was put, so that the index can be
// rebuilt from names and every file checked against what it claims. Raw
// entries are re-encoded with the configured codec when that codec is
// available and smaller; promotion decodes them back to the identical
// bytes (the raw encoding is canonical) and checks the original checksum.
type diskDir struct {
	dir    string
	codec  chunk.Codec
	limits chunk.Limits
	gen    atomic.Uint64 // starts at the clock, so names never repeat across runs
}

const fileExt = ".kvc"

func openDiskDir(dir string, codec chunk.Codec, lim chunk.Limits) (*diskDir, error) {
	for i := 0; i < 256; i++ {
		if err := os.MkdirAll(filepath.Join(dir, fmt.Sprintf("%02x", i)), 0o700); err != nil {
			return nil, fmt.Errorf("kvtier: disk tier: %w", err)
		}
	}
	if err := syncDir(dir); err != nil {
		return nil, err
	}
	d := &diskDir{dir: dir, codec: codec, limits: lim}
	d.gen.Store(uint64(time.Now().UnixNano()))
	return d, nil
}

// fileName names the file of one write of an entry. gen makes every write
// a new name, so that a late cleanup of one write (of an entry deleted and
// put again meanwhile) never removes another's file.
func fileName(k chunk.Key, checksum uint64, size int, gen uint64) string {
	return fmt.Sprintf("%02x/%016x%016x-%016x%016x-%d-%d-%016x%016x-%016x-%x-%x%s",
		byte(k.Content.Lo), k.Fingerprint.Hi, k.Fingerprint.Lo, k.Content.Hi, k.Content.Lo,
		k.Context.Kind, k.Context.Window, k.Context.ID.Hi, k.Context.ID.Lo, checksum, size, gen, fileExt)
}

func parseFileName(rel string) (k chunk.Key, checksum uint64, size int, gen uint64, ok bool) {
	var sub byte
	var kind uint8
	n, err := fmt.Sscanf(rel, "%02x/%016x%016x-%016x%016x-%d-%d-%016x%016x-%016x-%x-%x"+fileExt,
		&sub, &k.Fingerprint.Hi, &k.Fingerprint.Lo, &k.Content.Hi, &k.Content.Lo,
		&kind, &k.Context.Window, &k.Context.ID.Hi, &k.Context.ID.Lo, &checksum, &size, &gen)
	k.Context.Kind = chunk.ContextKind(kind)
	if err != nil || n != 12 || sub != byte(k.Content.Lo) || size <= 0 || fileName(k, checksum, size, gen) != rel {
		return chunk.Key{}, 0, 0, 0, false
	}
	return k, checksum, size, gen, true
}

func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return fmt.Errorf("kvtier: disk tier: %w", err)
	}
	defer d.Close()
	if err := d.Sync(); err != nil {
		return fmt.Errorf("kvtier: disk tier: syncing %s: %w", dir, err)
	}
	return nil
}

// encodeForDisk returns what to store for blob: its re-encoding with the
// disk codec when that is possible and smaller, else blob itself.
func (d *diskDir) encodeForDisk(blob []byte, codec chunk.Codec) []byte {
	if d.codec == chunk.CodecRaw || d.codec == chunk.CodecInvalid || codec != chunk.CodecRaw {
		return blob
	}
	e, err := chunk.Decode(blob, d.limits)
	if err != nil {
		return blob
	}
	enc, err := chunk.Encode(nil, e, d.codec)
	if err != nil || len(enc) >= len(blob) {
		return blob
	}
	return enc
}

// write stores blob crash-safely: a temp file in the final directory,
// fsync, rename, fsync of the directory. A crash leaves either no file, a
// temp file (removed at startup) or the complete file.
func (d *diskDir) write(k chunk.Key, checksum uint64, codec chunk.Codec, blob []byte) (rel string, size int64, err error) {
	rel = fileName(k, checksum, len(blob), d.gen.Add(1))
	data := d.encodeForDisk(blob, codec)
	sub := filepath.Join(d.dir, rel[:2])
	f, err := os.CreateTemp(sub, ".tmp-*")
	if err != nil {
		return "", 0, fmt.Errorf("kvtier: disk write: %w", err)
	}
	tmp := f.Name()
	fail := func(err error) (string, int64, error) {
		f.Close()
		os.Remove(tmp)
		return "", 0, fmt.Errorf("kvtier: disk write %s: %w", rel, err)
	}
	if _, err := f.Write(data); err != nil {
		return fail(err)
	}
	if err := f.Sync(); err != nil {
		return fail(err)
	}
	if err := f.Close(); err != nil {
		return fail(err)
	}
	if err := os.Rename(tmp, filepath.Join(d.dir, rel)); err != nil {
		os.Remove(tmp)
		return "", 0, fmt.Errorf("kvtier: disk write %s: %w", rel, err)
	}
	if err := syncDir(sub); err != nil {
		return "", 0, err
	}
	return rel, int64(len(data)), nil
}

// read reads the entry stored as rel into dst, which must be exactly the
// size it was put with, and checks that the result is the blob that was
// put (its checksum). dst may be nil, in which case it is allocated.
func (d *diskDir) read(rel string, checksum uint64, size int, dst []byte) ([]byte, error) {
	f, err := os.Open(filepath.Join(d.dir, rel))
	if err != nil {
		return nil, fmt.Errorf("kvtier: disk read: %w", err)
	}
	defer f.Close()
	b, err := d.readOpen(f, rel, checksum, size, dst)
	if err != nil {
		// The file is there: whatever fails now is the stored copy.
		return nil, fmt.Errorf("%w: %w", ErrDamaged, err)
	}
	return b, nil
}

func (d *diskDir) readOpen(f *os.File, rel string, checksum uint64, size int, dst []byte) ([]byte, error) {
	st, err := f.Stat()
	if err != nil {
		return nil, fmt.Errorf("kvtier: disk read: %w", err)
	}
	if dst == nil {
		dst = make([]byte, size)
	}
	if len(dst) != size {
		return nil, fmt.Errorf("kvtier: disk read %s into %d bytes", rel, len(dst))
	}
	var stored []byte
	if st.Size() == int64(size) {
		stored = dst
	} else if st.Size() > 0 && st.Size() < int64(size) {
		stored = make([]byte, st.Size())
	} else {
		return nil, fmt.Errorf("%w: %s is %d bytes, put as %d", chunk.ErrCorrupt, rel, st.Size(), size)
	}
	if _, err := io.ReadFull(f, stored); err != nil {
		return nil, fmt.Errorf("%w: reading %s: %v", chunk.ErrCorrupt, rel, err)
	}
	if err := d.restore(rel, stored, checksum, dst); err != nil {
		return nil, err
	}
	return dst, nil
}

// restore checks stored, the bytes of file rel, and leaves in dst the blob
// that was put, whose checksum is checksum and size len(dst). stored may
// be dst itself.
func (d *diskDir) restore(rel string, stored []byte, checksum uint64, dst []byte) error {
	size := len(dst)
	hd, err := chunk.Verify(stored, d.limits)
	if err != nil {
		return fmt.Errorf("%s: %w", rel, err)
	}
	if hd.Checksum == checksum && len(stored) == size {
		if &stored[0] != &dst[0] {
			copy(dst, stored)
		}
		return nil
	}
	if hd.Codec == chunk.CodecRaw {
		return fmt.Errorf("%w: %s holds checksum %016x, want %016x", chunk.ErrCorrupt, rel, hd.Checksum, checksum)
	}
	if len(stored) == len(dst) { // decoding must not read what it overwrites
		stored = bytes.Clone(stored)
	}
	e, err := chunk.Decode(stored, d.limits)
	if err != nil {
		return fmt.Errorf("%s: %w", rel, err)
	}
	out, err := chunk.Encode(dst[:0], e, chunk.CodecRaw)
	if err != nil || len(out) != size || &out[0] != &dst[0] {
		return fmt.Errorf("%w: %s re-encodes to %d bytes, want %d", chunk.ErrCorrupt, rel, len(out), size)
	}
	hd, err = chunk.ParseHeader(out, d.limits)
	if err != nil || hd.Checksum != checksum {
		return fmt.Errorf("%w: %s decodes to another entry", chunk.ErrCorrupt, rel)
	}
	return nil
}

func (d *diskDir) remove(rel string) error {
	if err := os.Remove(filepath.Join(d.dir, rel)); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("kvtier: disk remove: %w", err)
	}
	return nil
}

// diskFile is a file found valid at startup.
type diskFile struct {
	rel      string
	key      chunk.Key
	checksum uint64
	size     int   // as put
	stored   int64 // on disk
	codec    chunk.Codec
}

// recover lists the valid entry files, removing temp files, files whose
// names are not ours and files that fail their checksums (torn or
// corrupted writes, which it counts in damaged).
func (d *diskDir) recover(log *slog.Logger) (out []diskFile, damaged int, err error) {
	for i := 0; i < 256; i++ {
		sub := fmt.Sprintf("%02x", i)
		ents, err := os.ReadDir(filepath.Join(d.dir, sub))
		if err != nil {
			return nil, 0, fmt.Errorf("kvtier: disk recovery: %w", err)
		}
		for _, de := range ents {
			rel := sub + "/" + de.Name()
			if !de.Type().IsRegular() {
				continue
			}
			if strings.HasPrefix(de.Name(), ".tmp-") {
				log.Info("kvtier: removing interrupted write", "file", rel)
				_ = d.remove(rel)
				continue
			}
			f, err := d.check(rel)
			if err != nil {
				log.Warn("kvtier: dropping invalid disk entry", "file", rel, "err", err)
				_ = d.remove(rel)
				if _, _, _, _, ok := parseFileName(rel); ok {
					damaged++ // ours, and bad: not a stray file
				}
				continue
			}
			out = append(out, f)
		}
	}
	return out, damaged, nil
}

func (d *diskDir) check(rel string) (diskFile, error) {
	if _, _, _, _, ok := parseFileName(rel); !ok {
		return diskFile{}, errors.New("not an entry file name")
	}
	b, err := os.ReadFile(filepath.Join(d.dir, rel))
	if err != nil {
		return diskFile{}, err
	}
	return d.checkBytes(rel, b)
}

// checkBytes is check of a file's contents b.
func (d *diskDir) checkBytes(rel string, b []byte) (diskFile, error) {
	k, sum, size, _, ok := parseFileName(rel)
	if !ok {
		return diskFile{}, errors.New("not an entry file name")
	}
	hd, err := chunk.Verify(b, d.limits)
	if err != nil {
		return diskFile{}, err
	}
	switch {
	case hd.Key != k:
		return diskFile{}, fmt.Errorf("%w: file holds key %v", chunk.ErrCorrupt, hd.Key)
	case hd.Codec == chunk.CodecRaw && (hd.Checksum != sum || len(b) != size):
		return diskFile{}, fmt.Errorf("%w: file holds another blob", chunk.ErrCorrupt)
	case hd.Codec != chunk.CodecRaw && hd.Checksum != sum && len(b) >= size:
		return diskFile{}, fmt.Errorf("%w: re-encoded file not smaller", chunk.ErrCorrupt)
	}
	codec := hd.Codec
	if hd.Checksum != sum {
		codec = chunk.CodecRaw // re-encoded from raw; read restores it
	}
	return diskFile{rel: rel, key: k, checksum: sum, size: size, stored: int64(len(b)), codec: codec}, nil
}

// DiskUsage is the bytes of the entry files a disk tier in dir holds (0
// when dir does not exist): what a budget computed from the file system's
// free space must count as the tier's own.
func DiskUsage(dir string) (int64, error) {
	var n int64
	for i := 0; i < 256; i++ {
		sub := filepath.Join(dir, fmt.Sprintf("%02x", i))
		ents, err := os.ReadDir(sub)
		if errors.Is(err, os.ErrNotExist) {
			continue
		}
		if err != nil {
			return 0, fmt.Errorf("kvtier: disk usage: %w", err)
		}
		for _, de := range ents {
			if !de.Type().IsRegular() {
				continue
			}
			if fi, err := de.Info(); err == nil {
				n += fi.Size()
			}
		}
	}
	return n, nil
}
