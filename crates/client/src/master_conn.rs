//! Blocking RPC connection pool to the master.
