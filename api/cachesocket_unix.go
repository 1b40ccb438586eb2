//go:build unix

package api

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"os"
	"syscall"
)

// maxCacheFDs is how many descriptors RecvCacheFile makes room for: a
// sender that attaches more than one is refused, and the extra ones are
// received (and closed) rather than dropped by the kernel unseen.
const maxCacheFDs = 8

// SendCacheFile hands f to the node's cache socket at address (a leading
// "@" names Linux's abstract namespace) and returns the handle to register
// it with. f stays the caller's: it may close it once SendCacheFile
// returns. A refusal wraps ErrCacheRefused.
func SendCacheFile(ctx context.Context, address string, f *os.File) ([]byte, error) {
	var d net.Dialer
	c, err := d.DialContext(ctx, "unix", address)
	if err != nil {
		return nil, fmt.Errorf("api: cache socket: %w", err)
	}
	defer c.Close()
	uc, ok := c.(*net.UnixConn)
	if !ok {
		return nil, fmt.Errorf("api: cache socket %s is not a unix socket", address)
	}
	if dl, ok := ctx.Deadline(); ok {
		_ = uc.SetDeadline(dl)
	}
	sc, err := f.SyscallConn()
	if err != nil {
		return nil, fmt.Errorf("api: cache socket: %w", err)
	}
	var werr error
	// The descriptor is used inside Control, so f cannot be closed under
	// the send.
	if err := sc.Control(func(fd uintptr) {
		_, _, werr = uc.WriteMsgUnix([]byte(CacheSocketHello), syscall.UnixRights(int(fd)), nil)
	}); err != nil {
		return nil, fmt.Errorf("api: cache socket: %w", err)
	}
	if werr != nil {
		return nil, fmt.Errorf("api: cache socket: send: %w", werr)
	}
	reply := make([]byte, 1+CacheHandleBytes)
	if _, err := io.ReadFull(uc, reply[:1]); err != nil {
		return nil, fmt.Errorf("api: cache socket: answer: %w", err)
	}
	if reply[0] != cacheFileTaken {
		return nil, ErrCacheRefused
	}
	if _, err := io.ReadFull(uc, reply[1:]); err != nil {
		return nil, fmt.Errorf("api: cache socket: answer: %w", err)
	}
	return reply[1:], nil
}

// RecvCacheFile reads one hand-over from c: CacheSocketHello with exactly
// one descriptor. Anything else fails with ErrBadMessage, and every
// descriptor that came is closed. The file is the caller's to close.
func RecvCacheFile(c *net.UnixConn) (*os.File, error) {
	buf := make([]byte, len(CacheSocketHello)+1)
	oob := make([]byte, syscall.CmsgSpace(4*maxCacheFDs))
	n, oobn, flags, _, err := c.ReadMsgUnix(buf, oob)
	if err != nil {
		return nil, fmt.Errorf("api: cache socket: read: %w", err)
	}
	fds, perr := unixRights(oob[:oobn])
	bad := func(why string) (*os.File, error) {
		for _, fd := range fds {
			_ = syscall.Close(fd)
		}
		return nil, fmt.Errorf("%w: cache socket: %s", ErrBadMessage, why)
	}
	switch {
	case perr != nil:
		return bad(perr.Error())
	case flags&syscall.MSG_CTRUNC != 0:
		return bad("too many descriptors")
	case n != len(CacheSocketHello) || !bytes.Equal(buf[:n], []byte(CacheSocketHello)):
		return bad("not a hand-over")
	case len(fds) != 1:
		return bad(fmt.Sprintf("%d descriptors, want 1", len(fds)))
	}
	return os.NewFile(uintptr(fds[0]), "cache-shm"), nil
}

// unixRights returns every descriptor in the control messages oob.
func unixRights(oob []byte) ([]int, error) {
	msgs, err := syscall.ParseSocketControlMessage(oob)
	if err != nil {
		return nil, err
	}
	var fds []int
	for i := range msgs {
		if msgs[i].Header.Level != syscall.SOL_SOCKET || msgs[i].Header.Type != syscall.SCM_RIGHTS {
			continue
		}
		got, err := syscall.ParseUnixRights(&msgs[i])
		if err != nil {
			return fds, err
		}
		fds = append(fds, got...)
	}
	return fds, nil
}

// AnswerCacheFile answers a hand-over: the handle, or (handle nil) a
// refusal.
func AnswerCacheFile(c *net.UnixConn, handle []byte) error {
	if handle == nil {
		_, err := c.Write([]byte{cacheFileRefused})
		return err
	}
	if len(handle) != CacheHandleBytes {
		return fmt.Errorf("api: cache handle of %d bytes, want %d", len(handle), CacheHandleBytes)
	}
	_, err := c.Write(append([]byte{cacheFileTaken}, handle...))
	return err
}
