// Package layering holds a test of the module's package layering: imports
// point down the package table of docs/ARCHITECTURE.md (the table is the
// one statement of the order; the test parses it) and every package has a
// row in it.
package layering
