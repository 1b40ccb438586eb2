package api

import (
	"errors"
	"io"
	"net"
	"testing"

	"github.com/cespare/xxhash/v2"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/mem"

	"github.com/kvmesh/kvmesh/internal/cputime"
)

// sinkServer receives Put streams into a buffer and drops them. The
// benchmark's streams run one at a time, so one buffer serves them all:
// what is timed is the transport, not a fresh buffer's page faults.
type sinkServer struct {
	UnimplementedClientServer
	viaProto bool
	buf      []byte
}

func (s *sinkServer) body(n uint64) []byte {
	if uint64(cap(s.buf)) < n {
		s.buf = make([]byte, n)
	}
	return s.buf[:n]
}

func (s *sinkServer) Put(st grpc.ClientStreamingServer[PutFrame, PutResponse]) error {
	var hdr PutHeader
	if s.viaProto {
		f, err := st.Recv()
		if err != nil {
			return err
		}
		hdr = *f.GetHeader()
		buf := s.body(hdr.BlobBytes)
		off := 0
		for {
			f, err := st.Recv()
			if errors.Is(err, io.EOF) {
				break
			}
			if err != nil {
				return err
			}
			off += copy(buf[off:], f.GetData())
		}
		return st.SendAndClose(&PutResponse{})
	}
	if err := RecvHeader(st, &hdr); err != nil {
		return err
	}
	if err := RecvBody(st, s.body(hdr.BlobBytes)); err != nil {
		return err
	}
	return st.SendAndClose(&PutResponse{})
}

func startSink(b *testing.B, viaProto, tuned bool) ClientClient {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	var opts []grpc.ServerOption
	dopts := []grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials())}
	if tuned {
		opts = append(opts, ServerOptions()...)
		dopts = append(dopts, DialOptions()...)
	}
	if !viaProto {
		opts = append(opts, grpc.ForceServerCodecV2(Codec()))
	}
	srv := grpc.NewServer(opts...)
	RegisterClientServer(srv, &sinkServer{viaProto: viaProto})
	go func() { _ = srv.Serve(lis) }()
	b.Cleanup(srv.Stop)
	cc, err := grpc.NewClient(lis.Addr().String(), dopts...)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { cc.Close() })
	return NewClientClient(cc)
}

// BenchmarkStreamPut sends 16 MiB blobs over loopback gRPC in frames, with
// the zero-copy codec and with stock protobuf frames (a copy per frame on
// each side).
func BenchmarkStreamPut(b *testing.B) {
	const size = 16 << 20
	blob := make([]byte, size)
	for _, tc := range []struct {
		name     string
		viaProto bool
		tuned    bool
		frame    int
	}{
		{"codec/256KiB", false, false, 256 << 10}, {"codec/1MiB", false, false, 1 << 20},
		{"codec-tuned/256KiB", false, true, 256 << 10}, {"codec-tuned/1MiB", false, true, 1 << 20},
		{"proto/256KiB", true, false, 256 << 10}, {"proto/1MiB", true, false, 1 << 20},
	} {
		b.Run(tc.name, func(b *testing.B) {
			c := startSink(b, tc.viaProto, tc.tuned)
			ctx := b.Context()
			b.SetBytes(size)
			b.ResetTimer()
			cpu0 := cputime.Process()
			defer func() {
				// Client and server together: the CPU a GB costs on
				// both ends of a loopback stream.
				b.ReportMetric((cputime.Process()-cpu0).Seconds()/(float64(b.N)*size/1e9), "cpu-s/GB")
			}()
			for range b.N {
				if tc.viaProto {
					st, err := c.Put(ctx)
					if err != nil {
						b.Fatal(err)
					}
					if err := st.Send(&PutFrame{Kind: &PutFrame_Header{Header: &PutHeader{BlobBytes: size}}}); err != nil {
						b.Fatal(err)
					}
					for off := 0; off < size; off += tc.frame {
						if err := st.Send(&PutFrame{Kind: &PutFrame_Data{Data: blob[off : off+tc.frame]}}); err != nil {
							b.Fatal(err)
						}
					}
					if _, err := st.CloseAndRecv(); err != nil {
						b.Fatal(err)
					}
					continue
				}
				st, err := c.Put(ctx, grpc.ForceCodecV2(Codec()))
				if err != nil {
					b.Fatal(err)
				}
				if err := SendHeader(st, &PutHeader{BlobBytes: size}); err != nil {
					b.Fatal(err)
				}
				if err := SendBody(st, mem.SliceBuffer(blob), tc.frame); err != nil {
					b.Fatal(err)
				}
				if _, err := st.CloseAndRecv(); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// sink keeps the benchmark's hashes live.
var sink uint64

// BenchmarkLoopbackTCP is the floor under any transport of the same bytes
// on this machine: 16 MiB blobs over a plain loopback TCP socket, written
// in 1 MiB writes and read straight into one buffer (the two copies the
// kernel makes), then with what a store that serves entries adds: the
// sender copying each MiB into a write buffer first (as gRPC and Redis
// do) and the receiver hashing what it read (a client's checksum pass).
// cpu-s/GB is both ends together, as in BenchmarkStreamPut.
func BenchmarkLoopbackTCP(b *testing.B) {
	const size, chunk = 16 << 20, 1 << 20
	blob := make([]byte, size)
	for i := range blob {
		blob[i] = byte(i * 7)
	}
	for _, tc := range []struct {
		name       string
		copyFirst  bool
		hashOnRead bool
	}{{"kernel-only", false, false}, {"copy+hash", true, true}} {
		b.Run(tc.name, func(b *testing.B) {
			lis, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				b.Fatal(err)
			}
			defer lis.Close()
			done := make(chan error, 1)
			go func() {
				c, err := lis.Accept()
				if err != nil {
					done <- err
					return
				}
				defer c.Close()
				buf := make([]byte, size)
				for {
					if _, err := io.ReadFull(c, buf); err != nil {
						if errors.Is(err, io.EOF) {
							err = nil
						}
						done <- err
						return
					}
					if tc.hashOnRead {
						sink ^= xxhash.Sum64(buf)
					}
				}
			}()
			c, err := net.Dial("tcp", lis.Addr().String())
			if err != nil {
				b.Fatal(err)
			}
			wbuf := make([]byte, chunk)
			b.SetBytes(size)
			b.ResetTimer()
			cpu0 := cputime.Process()
			for range b.N {
				for off := 0; off < size; off += chunk {
					p := blob[off : off+chunk]
					if tc.copyFirst {
						copy(wbuf, p)
						p = wbuf
					}
					if _, err := c.Write(p); err != nil {
						b.Fatal(err)
					}
				}
			}
			c.Close()
			if err := <-done; err != nil {
				b.Fatal(err)
			}
			b.ReportMetric((cputime.Process()-cpu0).Seconds()/(float64(b.N)*size/1e9), "cpu-s/GB")
		})
	}
}
