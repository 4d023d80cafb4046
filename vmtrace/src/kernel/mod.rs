//! What the running kernel offers: BTF offsets, tracefs, capabilities.
pub mod btf;
pub mod preflight;
