//! What the running kernel offers: BTF offsets, tracefs, capabilities, THP.
pub mod btf;
pub mod preflight;
pub mod thp;
