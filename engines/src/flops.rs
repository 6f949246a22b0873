//! Analytic FLOP counts from a parameter table: 2 x (weight elements) x (output positions) for
//! every conv / linear weight, plus attention matmuls added by the caller.

use crate::weights::ParamTable;

/// Sums 2 * numel(weight) * positions(name) over rank-2/3/4 `*.weight` tensors for which
/// `positions` returns `Some` (the number of output pixels / tokens the layer is applied at).
pub(crate) fn weight_flops(table: &ParamTable, positions: impl Fn(&str) -> Option<f64>) -> f64 {
    table
        .entries
        .iter()
        .filter(|e| e.shape.len() >= 2 && e.name.ends_with("weight"))
        .filter_map(|e| positions(&e.name).map(|p| 2.0 * e.shape.iter().product::<usize>() as f64 * p))
        .sum()
}

/// Attention score and weighted-sum matmuls: 2 * 2 * q_len * kv_len * dim.
pub(crate) fn attention_flops(q_len: f64, kv_len: f64, dim: f64) -> f64 {
    4.0 * q_len * kv_len * dim
}

/// Parses the integer after `prefix` in `name` (e.g. `down_blocks.2.` -> 2).
pub(crate) fn index_after(name: &str, prefix: &str) -> Option<usize> {
    let rest = &name[name.find(prefix)? + prefix.len()..];
    rest.split('.').next()?.parse().ok()
}
