//go:build !unix

package api

import (
	"context"
	"errors"
	"net"
	"os"
)

var errNoCacheSocket = errors.New("api: the cache socket needs a unix system")

// SendCacheFile needs a unix system.
func SendCacheFile(context.Context, string, *os.File) ([]byte, error) { return nil, errNoCacheSocket }

// RecvCacheFile needs a unix system.
func RecvCacheFile(*net.UnixConn) (*os.File, error) { return nil, errNoCacheSocket }

// AnswerCacheFile needs a unix system.
func AnswerCacheFile(*net.UnixConn, []byte) error { return errNoCacheSocket }
