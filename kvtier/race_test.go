//go:build race

package kvtier

// raceEnabled shortens the pure-compute tests that the race detector
// slows without finding anything (they run one goroutine).
const raceEnabled = true
