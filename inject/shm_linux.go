//go:build linux

package inject

import (
	"fmt"
	"os"

	"golang.org/x/sys/unix"

	"github.com/kvmesh/kvmesh/pagedkv"
)

// mapShm maps [0, end) of f MAP_SHARED and returns the layers at offs.
// Only shared memory is mapped: a regular file on tmpfs or hugetlbfs (a
// memfd is one) of at least end bytes; anything else is ErrRefused, with
// the reason in why for the log alone.
func mapShm(f *os.File, offs []int64, layouts []pagedkv.CacheLayout, end int64) (layers [][]byte, unmap func(), id fileID, why string, err error) {
	refuse := func(format string, a ...any) ([][]byte, func(), fileID, string, error) {
		return nil, nil, fileID{}, fmt.Sprintf(format, a...), ErrRefused
	}
	if f == nil {
		return refuse("no file")
	}
	sc, err := f.SyscallConn()
	if err != nil {
		return refuse("file: %v", err)
	}
	var mem []byte
	var st unix.Stat_t
	var ferr error
	// The descriptor is used inside Control, so it cannot be closed under
	// the checks and the mapping.
	if err := sc.Control(func(fd uintptr) {
		if ferr = unix.Fstat(int(fd), &st); ferr != nil {
			return
		}
		if st.Mode&unix.S_IFMT != unix.S_IFREG {
			ferr = fmt.Errorf("not a regular file (mode %#o)", st.Mode)
			return
		}
		var fs unix.Statfs_t
		if ferr = unix.Fstatfs(int(fd), &fs); ferr != nil {
			return
		}
		if fs.Type != unix.TMPFS_MAGIC && fs.Type != unix.HUGETLBFS_MAGIC {
			ferr = fmt.Errorf("not on tmpfs or hugetlbfs (filesystem %#x)", fs.Type)
			return
		}
		if st.Size < end {
			ferr = fmt.Errorf("%d bytes, the layers need %d", st.Size, end)
			return
		}
		if end > int64(^uint(0)>>1) {
			ferr = fmt.Errorf("mapping of %d bytes", end)
			return
		}
		mem, ferr = unix.Mmap(int(fd), 0, int(end), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	}); err != nil {
		return refuse("file: %v", err)
	}
	if ferr != nil {
		return refuse("%v", ferr)
	}
	layers = make([][]byte, len(offs))
	for l, o := range offs {
		n := int64(layouts[l].LayerBytes())
		layers[l] = mem[o : o+n : o+n]
	}
	return layers, func() { _ = unix.Munmap(mem) }, fileID{uint64(st.Dev), st.Ino}, "", nil
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
	remove string // named file to remove on Close
}

// shmPage is the alignment CreateShm gives every layer (a page, so an
// engine may also map single layers).
const shmPage = 4096

// CreateShm creates a shared-memory cache for layers of the given layouts
// (one shared, or one per layer). An empty path creates an anonymous
// memfd; otherwise path (for example /dev/shm/kvmesh-cache-0) is created
// new, mode 0600, and removed by Close. Memory.File stays open until Close:
// it is what the engine hands the node (client.Client.RegisterCache).
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
	c := &ShmCache{}
	var fd int
	if path == "" {
		fd, err = unix.MemfdCreate("kvmesh-kv-cache", unix.MFD_CLOEXEC)
		if err != nil {
			return nil, fmt.Errorf("inject: memfd_create: %w", err)
		}
		path = "memfd:kvmesh-kv-cache"
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
	c.Layers = make([][]byte, layers)
	for l, o := range offs {
		n := int64(lays[l].LayerBytes())
		c.Layers[l] = c.mem[o : o+n : o+n]
	}
	c.Memory = Memory{Kind: MemoryShm, File: os.NewFile(uintptr(fd), path), Offsets: offs}
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
	if c.Memory.File != nil {
		if e := c.Memory.File.Close(); err == nil {
			err = e
		}
		c.Memory.File = nil
	}
	if c.remove != "" {
		if e := os.Remove(c.remove); err == nil {
			err = e
		}
		c.remove = ""
	}
	return err
}
