//! Shared helpers of the experiment binaries.
