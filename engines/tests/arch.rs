//! Architecture tests: parameter counts and key tables at the full profile, FLOP counts.

use cadence_engines::*;

#[test]
fn taesd_decoder_full_has_published_parameter_count_and_keys() {
    let t = param_table(ModelKind::TaesdDecoder, Profile::Full).unwrap();
    assert_eq!(t.num_params(), 1_222_531);
    assert_eq!(t.get("1.weight").unwrap().shape, vec![64, 4, 3, 3]);
    assert_eq!(t.get("1.bias").unwrap().shape, vec![64]);
    assert_eq!(t.get("3.conv.0.weight").unwrap().shape, vec![64, 64, 3, 3]);
    assert_eq!(t.get("3.conv.4.bias").unwrap().shape, vec![64]);
    assert_eq!(t.get("7.weight").unwrap().shape, vec![64, 64, 3, 3]);
    assert!(t.get("7.bias").is_none(), "post-upsample convs have no bias");
    assert_eq!(t.get("18.conv.2.weight").unwrap().shape, vec![64, 64, 3, 3]);
    assert_eq!(t.get("19.weight").unwrap().shape, vec![3, 64, 3, 3]);
    assert_eq!(t.get("19.bias").unwrap().shape, vec![3]);
    // 2 plain convs with bias + 3 without + 10 blocks x 3 convs x (w, b)
    assert_eq!(t.len(), 4 + 3 + 60);
}

#[test]
fn taesd_encoder_full_parameter_count_and_keys() {
    let t = param_table(ModelKind::TaesdEncoder, Profile::Full).unwrap();
    // conv 3->64 (1792) + 10 blocks (110784 each) + 3 stride-2 convs without bias (36864 each)
    // + conv 64->4 (2308)
    assert_eq!(t.num_params(), 1792 + 10 * 110_784 + 3 * 36_864 + 2308);
    assert_eq!(t.num_params(), 1_222_532);
    assert_eq!(t.get("0.weight").unwrap().shape, vec![64, 3, 3, 3]);
    assert_eq!(t.get("2.weight").unwrap().shape, vec![64, 64, 3, 3]);
    assert!(t.get("2.bias").is_none());
    assert_eq!(t.get("14.weight").unwrap().shape, vec![4, 64, 3, 3]);
}

#[test]
fn taesd_decoder_flops_match_design_figure() {
    let d = Taesd::decoder(Profile::Full, &WeightsSource::Synthetic { seed: 1 }, &Device::Cpu).unwrap();
    // docs/design.md: about 17.7 GMAC per 4x32x32 -> 3x256x256 frame.
    let gmac = d.flops_per_frame() / 2e9;
    assert!((gmac - 17.68).abs() < 0.05, "{gmac} GMAC");
    assert_eq!(d.num_params(), 1_222_531);
    assert_eq!(d.profile(), Profile::Full);
    assert_eq!(d.weights_label(), "synthetic(seed=1)");
}

#[test]
fn musetalk_unet_full_parameter_count() {
    let t = param_table(ModelKind::MuseTalkUnet, Profile::Full).unwrap();
    // Stable Diffusion 1.x UNet: 859,520,964 parameters (in_channels 4, cross_attention_dim 768).
    // MuseTalk: conv_in takes 8 channels (+4*320*9) and the 16 cross-attention blocks project a
    // 384-wide context instead of 768 (to_k and to_v: -2*384*C each, C summed over the blocks).
    let c_sum: usize = 2 * 320 + 2 * 640 + 2 * 1280 + 1280 + 3 * 1280 + 3 * 640 + 3 * 320;
    let expected = 859_520_964 + 4 * 320 * 9 - 2 * 384 * c_sum;
    assert_eq!(t.num_params(), expected);
    assert_eq!(t.get("conv_in.weight").unwrap().shape, vec![320, 8, 3, 3]);
    assert_eq!(t.get("conv_out.weight").unwrap().shape, vec![4, 320, 3, 3]);
    assert_eq!(
        t.get("down_blocks.0.attentions.0.transformer_blocks.0.attn2.to_k.weight").unwrap().shape,
        vec![320, 384]
    );
    assert_eq!(t.get("mid_block.attentions.0.proj_in.weight").unwrap().shape, vec![1280, 1280, 1, 1]);
    assert!(t.get("down_blocks.3.attentions.0.proj_in.weight").is_none(), "last down block has no attention");
}

#[test]
fn sd_vae_full_parameter_counts() {
    let t = param_table(ModelKind::SdVaeDecoder, Profile::Full).unwrap();
    // AutoencoderKL of SD 1.x / sd-vae-ft-mse: 83,653,863 parameters.
    assert_eq!(t.num_params(), 83_653_863);
    let dec: usize = t
        .entries
        .iter()
        .filter(|e| e.name.starts_with("decoder.") || e.name.starts_with("post_quant_conv."))
        .map(|e| e.shape.iter().product::<usize>())
        .sum();
    assert!((49_000_000..50_000_000).contains(&dec), "{dec}");
    assert_eq!(t.get("decoder.conv_in.weight").unwrap().shape, vec![512, 4, 3, 3]);
    assert_eq!(t.get("decoder.mid_block.attentions.0.to_q.weight").unwrap().shape, vec![512, 512]);
}

#[test]
fn whisper_tiny_encoder_parameter_count() {
    let t = param_table(ModelKind::WhisperTiny, Profile::Full).unwrap();
    let d = 384;
    let conv = 80 * d * 3 + d + d * d * 3 + d;
    let layer = 4 * d * d + 3 * d + 2 * (2 * d) + (d * 4 * d + 4 * d) + (4 * d * d + d);
    assert_eq!(t.num_params(), conv + 4 * layer);
    assert_eq!(t.get("layers.3.self_attn.k_proj.weight").unwrap().shape, vec![384, 384]);
    assert!(t.get("layers.0.self_attn.k_proj.bias").is_none(), "whisper's key projection has no bias");
}

#[test]
fn cpu_profile_keeps_topology() {
    for m in [
        ModelKind::TaesdDecoder,
        ModelKind::TaesdEncoder,
        ModelKind::MuseTalkUnet,
        ModelKind::SdVaeDecoder,
        ModelKind::WhisperTiny,
    ] {
        let full = param_table(m, Profile::Full).unwrap();
        let cpu = param_table(m, Profile::Cpu).unwrap();
        let names = |t: &weights::ParamTable| t.entries.iter().map(|e| e.name.clone()).collect::<Vec<_>>();
        assert_eq!(names(&full), names(&cpu), "{m}");
        assert!(cpu.num_params() * 8 < full.num_params(), "{m}");
    }
}
