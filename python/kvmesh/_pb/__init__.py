"""Generated protobuf and gRPC modules of api/*.proto (python/gen.sh, run by
`make proto`). Do not edit."""
