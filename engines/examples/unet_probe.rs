//! Scratch probe: UNet CPU cost versus widths / heads (used to pick Profile::Cpu).
use candle_core::{DType, Device, Tensor};
use candle_transformers::models::stable_diffusion::unet_2d::{
    BlockConfig, UNet2DConditionModel, UNet2DConditionModelConfig,
};
use std::time::Instant;

fn main() -> candle_core::Result<()> {
    let args: Vec<String> = std::env::args().collect();
    let b: usize = args.get(1).and_then(|s| s.parse().ok()).unwrap_or(8);
    for (ch, heads, groups) in [([32, 64, 128, 128], 8, 32), ([32, 64, 128, 128], 1, 32), ([64, 128, 256, 256], 1, 32)]
    {
        let blk = |c: usize, attn: bool| BlockConfig {
            out_channels: c,
            use_cross_attn: attn.then_some(1),
            attention_head_dim: heads,
        };
        let cfg = UNet2DConditionModelConfig {
            center_input_sample: false,
            flip_sin_to_cos: true,
            freq_shift: 0.0,
            blocks: vec![blk(ch[0], true), blk(ch[1], true), blk(ch[2], true), blk(ch[3], false)],
            layers_per_block: 2,
            downsample_padding: 1,
            mid_block_scale_factor: 1.0,
            norm_num_groups: groups,
            norm_eps: 1e-5,
            cross_attention_dim: 384,
            sliced_attention_size: None,
            use_linear_projection: false,
        };
        let vm = candle_nn::VarMap::new();
        let vb = candle_nn::VarBuilder::from_varmap(&vm, DType::F32, &Device::Cpu);
        let u = UNet2DConditionModel::new(vb, 8, 4, false, cfg)?;
        let x = Tensor::randn(0f32, 1., (b, 8, 32, 32), &Device::Cpu)?;
        let a = Tensor::randn(0f32, 1., (b, 50, 384), &Device::Cpu)?;
        u.forward(&x, 0.0, &a)?;
        let t = Instant::now();
        for _ in 0..2 {
            u.forward(&x, 0.0, &a)?;
        }
        let s = t.elapsed().as_secs_f64() / 2.0;
        println!("{ch:?} heads {heads} groups {groups}: {:.1} frames/s", b as f64 / s);
    }
    Ok(())
}
