// Package layering holds a test of the module's package layering: imports
// point down the package table of docs/ARCHITECTURE.md (the table is the
// one statement of the order; the test parses it) and every package has a
// row in it; and the client's full dependency list matches client/deps.txt
// and holds nothing of the server. After an intended change of the client's
// dependencies, `go test ./tests/layering -run TestClientDeps -update`
// rewrites the file, to be reviewed and committed with the change.
package layering
