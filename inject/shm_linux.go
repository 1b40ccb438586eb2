//go:build linux

package inject

import (
	"fmt"
	"os"

	"golang.org/x/sys/unix"

	"github.com/kvmesh/kvmesh/pagedkv"
)

// mapShm maps [0, end) of the file at path MAP_SHARED and returns the
// layers at offs. follow allows the path's last component to be a link
// (the /proc/<pid>/fd/<n> magic links); otherwise it must not be one, so a
// link planted in /dev/shm cannot point the node at another file.
func mapShm(path string, follow bool, offs []int64, layouts []pagedkv.CacheLayout, end int64) ([][]byte, func(), error) {
	flags := unix.O_RDWR | unix.O_CLOEXEC
	if !follow {
		flags |= unix.O_NOFOLLOW
	}
	fd, err := unix.Open(path, flags, 0)
	if err != nil {
		return nil, nil, fmt.Errorf("%w: open %s: %w", ErrInvalidCache, path, err)
	}
	defer unix.Close(fd) // the mapping outlives the descriptor
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return nil, nil, fmt.Errorf("%w: stat %s: %w", ErrInvalidCache, path, err)
	}
	if st.Mode&unix.S_IFMT != unix.S_IFREG {
		return nil, nil, fmt.Errorf("%w: %s is not a regular file", ErrInvalidCache, path)
	}
	// Only shared memory: a /proc/<pid>/fd/<n> path could otherwise name
	// any file some process holds open, and the node would write KV into
	// it.
	var fs unix.Statfs_t
	if err := unix.Fstatfs(fd, &fs); err != nil {
		return nil, nil, fmt.Errorf("%w: statfs %s: %w", ErrInvalidCache, path, err)
	}
	if fs.Type != unix.TMPFS_MAGIC && fs.Type != unix.HUGETLBFS_MAGIC {
		return nil, nil, fmt.Errorf("%w: %s is not on tmpfs or hugetlbfs (filesystem %#x)", ErrInvalidCache, path, fs.Type)
	}
	if st.Size < end {
		return nil, nil, fmt.Errorf("%w: %s holds %d bytes, the layers need %d", ErrInvalidCache, path, st.Size, end)
	}
	if end > int64(^uint(0)>>1) {
		return nil, nil, fmt.Errorf("%w: mapping of %d bytes", ErrInvalidCache, end)
	}
	mem, err := unix.Mmap(fd, 0, int(end), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		return nil, nil, fmt.Errorf("%w: mmap %s: %w", ErrInvalidCache, path, err)
	}
	layers := make([][]byte, len(offs))
	for l, o := range offs {
		n := int64(layouts[l].LayerBytes())
		layers[l] = mem[o : o+n : o+n]
	}
	return layers, func() { _ = unix.Munmap(mem) }, nil
}

// ShmCache is a paged KV cache placed in shared memory by the engine side:
// its Layers are the engine's view, and Memory is what it registers with
// the node. Close unmaps it (and removes a named file).
type ShmCache struct {
	// Layers holds one slice per layer, each its layout's LayerBytes long,
	// page-aligned.
	Layers [][]byte
	// Memory is the registration's Memory (MemoryShm with explicit,
	// page-aligned offsets).
	Memory Memory

	mem    []byte
	fd     int    // memfd kept open while the cache lives; -1 for a named file
	remove string // named file to remove on Close
}

// shmPage is the alignment CreateShm gives every layer (a page, so an
// engine may also map single layers).
const shmPage = 4096

// CreateShm creates a shared-memory cache for layers of the given layouts
// (one shared, or one per layer). An empty path creates an anonymous memfd
// and names it /proc/<pid>/fd/<n>, which the node can open while this
// process keeps it; otherwise path (for example /dev/shm/kvmesh-cache-0) is
// created new, mode 0600, and removed by Close.
func CreateShm(path string, layers int, layouts []pagedkv.CacheLayout) (*ShmCache, error) {
	lays, err := layerLayouts(layouts, layers)
	if err != nil {
		return nil, err
	}
	offs := make([]int64, layers)
	var end int64
	for l, lay := range lays {
		if err := lay.Validate(); err != nil {
			return nil, fmt.Errorf("%w: layer %d: %w", ErrInvalidCache, l, err)
		}
		offs[l] = end
		end += (int64(lay.LayerBytes()) + shmPage - 1) / shmPage * shmPage
	}
	c := &ShmCache{fd: -1}
	var fd int
	if path == "" {
		fd, err = unix.MemfdCreate("kvmesh-kv-cache", unix.MFD_CLOEXEC)
		if err != nil {
			return nil, fmt.Errorf("inject: memfd_create: %w", err)
		}
		c.fd = fd
		path = fmt.Sprintf("/proc/%d/fd/%d", os.Getpid(), fd)
	} else {
		fd, err = unix.Open(path, unix.O_RDWR|unix.O_CREAT|unix.O_EXCL|unix.O_CLOEXEC|unix.O_NOFOLLOW, 0o600)
		if err != nil {
			return nil, fmt.Errorf("inject: create %s: %w", path, err)
		}
		c.remove = path
	}
	fail := func(err error) (*ShmCache, error) {
		if c.mem != nil {
			_ = unix.Munmap(c.mem)
		}
		_ = unix.Close(fd)
		if c.remove != "" {
			_ = os.Remove(c.remove)
		}
		return nil, err
	}
	if err := unix.Ftruncate(fd, end); err != nil {
		return fail(fmt.Errorf("inject: size %s to %d bytes: %w", path, end, err))
	}
	c.mem, err = unix.Mmap(fd, 0, int(end), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		return fail(fmt.Errorf("inject: mmap %s: %w", path, err))
	}
	if c.fd < 0 {
		_ = unix.Close(fd)
	}
	c.Layers = make([][]byte, layers)
	for l, o := range offs {
		n := int64(lays[l].LayerBytes())
		c.Layers[l] = c.mem[o : o+n : o+n]
	}
	c.Memory = Memory{Kind: MemoryShm, Path: path, Offsets: offs}
	return c, nil
}

// Close unmaps the cache, closes the memfd or removes the file. The node's
// own mapping stays valid until it unregisters.
func (c *ShmCache) Close() error {
	var err error
	if c.mem != nil {
		err = unix.Munmap(c.mem)
		c.mem, c.Layers = nil, nil
	}
	if c.fd >= 0 {
		if e := unix.Close(c.fd); err == nil {
			err = e
		}
		c.fd = -1
	}
	if c.remove != "" {
		if e := os.Remove(c.remove); err == nil {
			err = e
		}
		c.remove = ""
	}
	return err
}
