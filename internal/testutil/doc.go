// Package testutil is the support every kvmesh test shares: waiting on a
// condition (WaitFor), the goroutine-leak check each package's TestMain
// runs (VerifyNoLeaks), the skip for tests too slow for -short
// (SkipIfShort), test model specs and chunk entries (Spec, Entry,
// Blob), and small file systems for disk-fault tests (Tmpfs).
//
// Only tests import it: it is internal, and no production package imports
// it, so nothing here reaches a binary or the client (the layering test
// checks that).
package testutil
