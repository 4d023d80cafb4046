//! Files for other tools, written beside vmtrace's own: pprof profiles.
pub mod pprof;
