//go:build !cuda

package kvtier

// extraDeviceMakers is empty without the cuda tag: the tier tests run on
// the host stand-ins only.
func extraDeviceMakers() []deviceMaker { return nil }
