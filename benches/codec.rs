//! Placeholder; replaced by the request-parser benchmarks.
fn main() {}
