// Package inject is the node side of KV injection: an inference engine
// registers its paged KV cache with its local node once, then asks the node
// to inject stored chunks at positions of a new prompt.
//
// A Service holds the registrations (Register for a shared-memory file the
// node maps MAP_SHARED, RegisterInProcess for layer slices handed over
// directly) and serves Inject requests. For every chunk of a request it asks
// a Fetcher (declared here, implemented by the node: local tier first, then
// a replica) for the encoded entry, in parallel with a bound, and verifies
// it completely before any byte of it is written: fingerprint, content ID,
// tokens, shape against the cache layout, and the checksum of every layer.
// A chunk that fails is a MISS and nothing of it is written. An entry
// still arriving from a replica (Fetched.Arriving: a stream that carries
// the layers of every chunk read from that replica, in layer order) is
// verified by its header, whose checksum covers every layer's, and each
// of its layers against its checksum once it arrived, before it is
// written: the pipeline waits for layer l of such entries before it
// starts layer l, so decoding and writing follow the bytes as they come.
// A layer that fails or never comes makes its chunk a MISS from there on.
//
// The hits then go through a two-stage pipeline by layer: workers decode
// layer l+1 of every hit (chunk.DecodeRange for the cache's head range, any
// codec) into a bounded ring of scratch buffers while layer l is rotated to
// its target positions and scattered into the registered memory by
// cudakern's fused kernel. After layer l of every hit is written, the
// request's OnLayer callback runs, so the engine may start computing layer l
// before later layers land. Each chunk is answered EXACT (its stored context
// is the wanted one), APPROXIMATE (another encoding of the same tokens) or
// MISS, with the context found. OnPlan, if set, gets those answers once
// every chunk is verified, before the first layer is written, so an engine
// knows which tokens it must compute and can start its forward pass at
// once, layer l after OnLayer(l).
//
// TierFetcher is the node's Fetcher over its kvtier store and a Remote
// (the replicas): an exact entry wherever it is, local first, else an
// approximate one, local first. It is a BatchFetcher: for one request it
// ranks every chunk without a local exact entry with one BatchRemote call
// (the node sends one Lookup per replica node, not one per chunk), then
// reads the entries, Parallel at once, and the Service verifies each as it
// arrives. With a StreamRemote, the entries chosen on the replicas are read
// with one GetMany (a stream per replica node) and handed over as their
// heads arrive. Engine-side, engine.CacheInjector is what
// an engine calls (RunInjected); an adapter maps its InjectChunks onto
// Inject (see serviceInjector in the tests).
//
// Memory kinds: MemoryShm (a memfd, or a file on tmpfs or hugetlbfs,
// handed to Register as an open file: the node's cache socket receives it
// from the engine as a descriptor, so nothing is ever mapped by name; a
// file a registration maps already is refused, and every refusal of the
// memory is ErrRefused alone) and the in-process kind are implemented;
// MemoryCUDAIPC is an engine's cache in its GPU memory, one IPC handle
// per layer (and each layer's offset in its handle's allocation): checked
// here, opened through Config.GPU (cudakern/gpu.Driver in a cuda build),
// and written there, the source staged through the device; without a GPU
// it is refused with ErrUnsupported. Register dispatches on the kind, one branch each. CreateShm is the
// engine-side helper that creates and maps such a file so the engine can
// place its cache in it.
//
// Device to device: for a MemoryCUDAIPC cache, a DeviceFetcher (TierFetcher
// over a DeviceLocal: the node's GPU tier on the cache's device) lends
// exact local entries in device memory (Fetched.Device) instead of host
// bytes. Such a hit is verified from the header the tier parsed when the
// entry entered device memory, after checking every layer's checksum on
// the host bytes it came from; each layer is then one kernel launch from
// the entry's device address (cudakern.DeviceCache.InjectDevice), a codec
// payload decoded in the same pass. A device hit that does not fit is read
// again on the host and verified there as any entry.
package inject
