//! Files in and out, below every stage: checked `.npy` arrays ([`npy`]), the one policy for every
//! file cadence writes ([`output`]), and the bounds on what a request may make cadence allocate
//! ([`memory`]).

pub mod memory;
pub mod npy;
pub mod output;
