// Package cputime reads the CPU time the process has used, for benchmarks:
// on a shared machine it measures the work a request costs, which wall
// time does not.
package cputime
