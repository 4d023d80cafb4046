//! Files other tools open, written beside vmtrace's own (sinks of the
//! model, like `report`): pprof profiles and the Perfetto trace.
pub mod perfetto;
pub mod pprof;
