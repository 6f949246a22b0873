//! The render loop (frames kept as tensors on the engines' device, `cadence::backend::resident`) against
//! a straightforward reference built from the host-buffer APIs, frame by frame. Written once and
//! run per device: on the CPU always; in a build with `engines-cuda` on a machine with a GPU,
//! also with the engines on CUDA and the backend made on candle's stream, i.e. the
//! device-resident path (`cargo test -p cadence --features engines-cuda --test resident`).
//!
//! What the CPU run guards, plainly: the reference uses the same networks and the same CPU
//! kernels as the loop, one keyframe and one frame at a time, so it checks the loop's
//! orchestration (batching, which UNet row belongs to which keyframe, the bypass in silence,
//! reusing the composited rest frame, frame order), not the kernels' or networks' arithmetic,
//! which `kernels.rs`, `composite.rs` and the engines' tests check against independent f64
//! references.

mod common;

use cadence::backend::composite::Compositor;
use cadence::backend::resident::{self, Residency};
use cadence::measure::fixtures::CheckClip;
use cadence::musetalk::{DecoderKind, Engines, MuseTalkInfill, FACE_SIDE, LATENT_DIM};
use cadence::schedules::keyframes::speech_distance;
use cadence::{Backend, KeyframeSchedule};
use cadence_engines::{Batch, Device, KeyframeModel, Profile, Tensor};

/// (engines' device, backend, residency the render must report)
fn devices() -> Vec<(Device, Backend, Residency)> {
    #[allow(unused_mut)]
    let mut v = vec![(Device::Cpu, Backend::Cpu, Residency::Host)];
    #[cfg(feature = "engines-cuda")]
    match Device::new_cuda(0) {
        Ok(d) => {
            let b = Backend::for_engines(cadence::BackendChoice::Cuda, &d).expect("CUDA backend on candle's stream");
            v.push((d, b, Residency::Device));
        }
        Err(e) => common::skipped("resident (device-resident run)", &format!("no CUDA device ({e})")),
    }
    v
}

/// The reference: every keyframe through `predict` alone, the host expansion and easing, every
/// frame decoded alone (a bypassed frame's eased latent is the rest latent, so it decodes to the
/// rest crop) and composited into a fresh copy of the background. With `image` infill, every
/// live keyframe's latent is decoded alone and the crops (the rest crop for bypassed keyframes)
/// are expanded and eased toward the rest crop instead; nothing else is decoded.
fn reference(engines: &Engines, clip: &CheckClip, compositor: &Compositor) -> Vec<Vec<u8>> {
    let CheckClip { features, speech, schedule, avatar, opts, .. } = clip;
    let decode = |latent: &[f32]| {
        engines.decoder.decode(&Batch::new(vec![1, 4, 32, 32], latent.to_vec()).unwrap()).unwrap().data
    };
    let image = opts.infill == MuseTalkInfill::Image;
    let ramp = opts.ramp;
    let distance = speech_distance(speech);
    let per_window = features.shape[1] * features.shape[2];
    let mut keys = Vec::new();
    for &k in schedule.keyframes() {
        let k = k as usize;
        if cadence_kernels::math::easing_weight(distance[k], ramp) == 0.0 {
            keys.extend_from_slice(if image { &avatar.rest_rgb } else { &avatar.rest });
            continue;
        }
        let latents = Batch::new(vec![1, 8, 32, 32], [avatar.masked.as_slice(), &avatar.reference].concat()).unwrap();
        let audio = Batch::new(
            vec![1, features.shape[1], features.shape[2]],
            features.data[k * per_window..(k + 1) * per_window].to_vec(),
        )
        .unwrap();
        let latent = engines.unet.predict(&latents, &audio).unwrap().data;
        keys.extend(if image { decode(&latent) } else { latent });
    }
    let (dim, rest) = if image { (3 * FACE_SIDE * FACE_SIDE, &avatar.rest_rgb) } else { (LATENT_DIM, &avatar.rest) };
    let mut frames = Backend::Cpu.expand(&keys, schedule, dim, cadence::Method::Slerp).unwrap();
    Backend::Cpu.ease(&mut frames, rest, &distance, ramp).unwrap();
    frames
        .chunks(dim)
        .map(|frame| {
            let crop = if image { frame.to_vec() } else { decode(frame) };
            let mut nv12 = vec![0u8; compositor.frame_bytes()];
            compositor.compose_frame(&crop, FACE_SIDE, FACE_SIDE, engines.decoder_range(), &mut nv12).unwrap();
            nv12
        })
        .collect()
}

#[test]
fn render_loop_matches_the_frame_by_frame_reference_on_every_device() {
    for (device, backend, residency) in devices() {
        let engines = Engines::load(Profile::Cpu, DecoderKind::Taesd, &device, None).unwrap();
        for infill in [MuseTalkInfill::Latent, MuseTalkInfill::Image] {
            matches_the_reference(&engines, &device, &backend, residency, infill);
        }
    }
}

/// One infill's render of the check clip against [`reference`].
fn matches_the_reference(
    engines: &Engines,
    device: &Device,
    backend: &Backend,
    residency: Residency,
    infill: MuseTalkInfill,
) {
    let n = 30;
    let mut clip = CheckClip::new(engines, n, 11).unwrap();
    clip.opts.infill = infill;
    let (frames, stats) = clip.render(engines, backend).unwrap();
    assert_eq!(stats.residency, residency, "{device:?}");
    assert_eq!(frames.len(), n);
    assert!(stats.bypassed_frames >= 4, "the pause must bypass frames: {stats:?}");
    match infill {
        MuseTalkInfill::Latent => assert_eq!(stats.decoded_frames + stats.bypassed_frames, n),
        // The decoder runs on the live keyframes only.
        MuseTalkInfill::Image => assert_eq!(stats.decoded_frames, stats.keyframes_evaluated),
    }
    assert!(stats.keyframes_evaluated < stats.keyframes_scheduled);

    let want = reference(engines, &clip, &clip.compositor(&Backend::Cpu).unwrap());
    // On the CPU the batched loop gives the reference's bytes exactly (measured: every byte
    // of every frame equal). On a GPU the reference runs the expansion and easing on the CPU
    // and the engines at batch 1, so values differ in the last bits: 2 levels allowed (a
    // bound not yet checked on a GPU).
    let tolerance = if device.is_cpu() { 0 } else { 2 };
    for (i, (got, want)) in frames.iter().zip(&want).enumerate() {
        let worst = got.iter().zip(want).map(|(a, b)| a.abs_diff(*b)).max().unwrap();
        assert!(worst <= tolerance, "{device:?}, {infill:?}: frame {i} differs from the reference by {worst} levels");
    }
    // The frames are not all alike (the comparison above can fail).
    assert!(frames[0] != frames[12] && frames[0] != frames[n - 1]);
}

/// `image` infill against `latent` on the same clip: a live keyframe outside the easing ramp is
/// the decoder's output of the UNet's latent either way (the same bytes), so are the bypassed
/// frames (the rest crop); the frames between keyframes differ (blends of crops, not decoded
/// blends of latents), and the decoder ran on the live keyframes only.
#[test]
fn image_infill_shares_the_keyframes_and_bypass_of_latent_infill() {
    let n = 30;
    let engines = Engines::load(Profile::Cpu, DecoderKind::Taesd, &Device::Cpu, None).unwrap();
    let mut clip = CheckClip::new(&engines, n, 11).unwrap();
    let (latent, latent_stats) = clip.render(&engines, &Backend::Cpu).unwrap();
    clip.opts.infill = MuseTalkInfill::Image;
    let (image, image_stats) = clip.render(&engines, &Backend::Cpu).unwrap();
    let distance = speech_distance(&clip.speech);
    let weight = |f: usize| cadence_kernels::math::easing_weight(distance[f], clip.opts.ramp);
    let keys: Vec<usize> = clip.schedule.keyframes().iter().map(|&k| k as usize).collect();
    let (mut same, mut between) = (0, 0);
    for f in 0..n {
        if weight(f) == 0.0 || (keys.contains(&f) && weight(f) == 1.0) {
            assert!(image[f] == latent[f], "frame {f} (keyframe or bypassed) differs between the infills");
            same += 1;
        } else if !keys.contains(&f) && weight(f) == 1.0 {
            assert!(image[f] != latent[f], "frame {f} between keyframes is the same with both infills");
            between += 1;
        }
    }
    assert!(same >= 8 && between >= 8, "{same} shared frames, {between} frames between keyframes");
    assert_eq!(image_stats.keyframes_evaluated, latent_stats.keyframes_evaluated);
    assert_eq!(image_stats.decoded_frames, image_stats.keyframes_evaluated);
    assert_eq!(latent_stats.decoded_frames, n - latent_stats.bypassed_frames);
}

#[test]
fn host_view_of_a_tensor_respects_offsets_and_layouts() {
    let t = Tensor::arange(0f32, 24.0, &Device::Cpu).unwrap().reshape((3, 2, 4)).unwrap();
    let mid = t.narrow(0, 1, 1).unwrap();
    resident::with_host_f32(&mid, |v| {
        assert_eq!(v, (8..16).map(|x| x as f32).collect::<Vec<_>>().as_slice());
        Ok(())
    })
    .unwrap();
    let transposed = t.narrow(0, 2, 1).unwrap().transpose(1, 2).unwrap();
    resident::with_host_f32(&transposed, |v| {
        assert_eq!(v, &[16.0, 20.0, 17.0, 21.0, 18.0, 22.0, 19.0, 23.0]);
        Ok(())
    })
    .unwrap();
    let err = resident::with_host_f32(&t.to_dtype(candle_core::DType::F64).unwrap(), |_| Ok(())).unwrap_err();
    assert!(err.to_string().contains("f32"), "{err}");
}

#[test]
fn expand_eased_checks_sizes_and_matches_the_host_ops() {
    let schedule = KeyframeSchedule::fixed_stride(7, 3).unwrap();
    let dim = 16;
    let mut r = common::rng(3);
    let keys = common::randn(&mut r, schedule.count() * dim);
    let rest = common::randn(&mut r, dim);
    let distance = speech_distance(&[true, true, false, false, false, false, true]);
    let t = Tensor::from_slice(&keys, (schedule.count(), 4, 2, 2), &Device::Cpu).unwrap();
    let infill = resident::Infill {
        schedule: &schedule,
        method: cadence::Method::Slerp,
        rest: &rest,
        distance: &distance,
        ramp: 2,
    };
    let (frames, _, _) = resident::expand_eased(&Backend::Cpu, &t, &infill).unwrap();
    assert_eq!(frames.dims(), &[7, 4, 2, 2]);
    let mut want = Backend::Cpu.expand(&keys, &schedule, dim, cadence::Method::Slerp).unwrap();
    Backend::Cpu.ease(&mut want, &rest, &distance, 2).unwrap();
    assert_eq!(frames.flatten_all().unwrap().to_vec1::<f32>().unwrap(), want);

    let short = Tensor::from_slice(&keys[..dim], (1, 4, 2, 2), &Device::Cpu).unwrap();
    let err = resident::expand_eased(&Backend::Cpu, &short, &infill).unwrap_err();
    assert!(err.to_string().contains("keyframe"), "{err}");
    let err = resident::expand_eased(&Backend::Cpu, &t, &resident::Infill { distance: &distance[..3], ..infill })
        .unwrap_err();
    assert!(err.to_string().contains("easing"), "{err}");
}

#[test]
fn cpu_engines_keep_frames_in_host_memory() {
    assert_eq!(resident::residency(&Backend::Cpu, &Device::Cpu), Residency::Host);
}

/// The windowed render (`RenderOptions::window`) against the whole clip as one window: the
/// same bytes in every frame, for strides 1, 2, 3 and an irregular keyframe list, with windows
/// whose boundaries fall before, inside and after the pause (frames 9..21) and inside decoder
/// and UNet batches; and the same with `image` infill at stride 3 and on the irregular list.
#[test]
fn windowed_render_is_byte_identical_to_the_whole_clip_on_every_device() {
    let n = 41;
    for (device, backend, _) in devices() {
        let engines = Engines::load(Profile::Cpu, DecoderKind::Taesd, &device, None).unwrap();
        let mut clip = CheckClip::new(&engines, n, 5).unwrap();
        let schedules = [
            KeyframeSchedule::fixed_stride(n, 1).unwrap(),
            KeyframeSchedule::fixed_stride(n, 2).unwrap(),
            KeyframeSchedule::fixed_stride(n, 3).unwrap(),
            // Starts after frame 0 (the first frames hold it), a keyframe inside the pause,
            // irregular gaps, ends before the last frame (the tail holds it).
            KeyframeSchedule::explicit(n, &[2, 3, 7, 12, 20, 22, 23, 31, 38]).unwrap(),
        ];
        let image = [schedules[2].clone(), schedules[3].clone()].map(|s| (MuseTalkInfill::Image, s));
        for (infill, schedule) in schedules.map(|s| (MuseTalkInfill::Latent, s)).into_iter().chain(image) {
            clip.opts.infill = infill;
            clip.schedule = schedule;
            clip.opts.window = None;
            let (whole, whole_stats) = clip.render(&engines, &backend).unwrap();
            assert_eq!(whole.len(), n);
            for window in [1, 7, 25] {
                clip.opts.window = Some(window);
                let (frames, stats) = clip.render(&engines, &backend).unwrap();
                assert_eq!(frames.len(), n, "window {window}");
                for (i, (a, b)) in frames.iter().zip(&whole).enumerate() {
                    let keys = clip.schedule.keyframes();
                    assert!(a == b, "{device:?}, {infill:?}, {keys:?}, window {window}: frame {i} differs");
                }
                assert_eq!(
                    (stats.keyframes_evaluated, stats.decoded_frames, stats.bypassed_frames),
                    (whole_stats.keyframes_evaluated, whole_stats.decoded_frames, whole_stats.bypassed_frames)
                );
            }
        }
    }
}

/// `clip` through the render loop on the CPU backend, with its own sink and progress callback.
fn render_on_cpu(
    engines: &Engines,
    clip: &CheckClip,
    compositor: &Compositor,
    sink: impl FnMut(usize, &[u8]) -> anyhow::Result<()>,
    progress: impl FnMut(usize),
) -> anyhow::Result<cadence::frame_loop::RenderStats> {
    let CheckClip { opts, features, speech, schedule, avatar, .. } = clip;
    cadence::musetalk::frames::render(
        engines,
        &Backend::Cpu,
        opts,
        features,
        cadence::frame_loop::ClipPart::whole(&cadence::schedules::keyframes::speech_distance(speech)),
        schedule,
        std::slice::from_ref(avatar),
        std::slice::from_ref(compositor),
        sink,
        progress,
    )
}

/// A window's frames leave before the next window's UNet batches run (the point of windows),
/// and with one window every UNet batch runs before the first frame. Read off the progress
/// callback: 0 after each UNet batch, 1 after each frame handed to the sink.
#[test]
fn windowed_render_hands_out_frames_before_the_clip_is_through_the_unet() {
    let engines = Engines::load(Profile::Cpu, DecoderKind::Taesd, &Device::Cpu, None).unwrap();
    let mut clip = CheckClip::new(&engines, 60, 7).unwrap();
    clip.schedule = KeyframeSchedule::fixed_stride(60, 2).unwrap();
    let order = |clip: &CheckClip| {
        let compositor = clip.compositor(&Backend::Cpu).unwrap();
        let mut events = Vec::new();
        render_on_cpu(&engines, clip, &compositor, |_, _| Ok(()), |e| events.push(e)).unwrap();
        let unet_batches = events.iter().filter(|&&e| e == 0).count();
        let before_first_frame = events.iter().take_while(|&&e| e == 0).count();
        (unet_batches, before_first_frame)
    };
    clip.opts.window = None;
    let (batches, before) = order(&clip);
    assert!(batches >= 5, "the clip needs several UNet batches ({batches})");
    assert_eq!(before, batches, "one window: all UNet work comes first");
    clip.opts.window = Some(10);
    let (batches_w, before_w) = order(&clip);
    assert_eq!(batches_w, batches, "windows run the same UNet batches");
    assert!(before_w <= 2, "a 10-frame window at stride 2 and batch 4 needs at most 2 UNet batches, ran {before_w}");
}

/// A cancelled render stops with `Cancelled` before its next engine batch, and nothing more
/// reaches the sink.
#[test]
fn cancel_flag_stops_the_render_at_the_next_batch() {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;
    let engines = Engines::load(Profile::Cpu, DecoderKind::Taesd, &Device::Cpu, None).unwrap();
    let mut clip = CheckClip::new(&engines, 40, 3).unwrap();
    let flag = Arc::new(AtomicBool::new(false));
    clip.opts.cancel = Some(flag.clone());
    clip.opts.window = Some(8);
    let compositor = clip.compositor(&Backend::Cpu).unwrap();
    let mut seen = 0;
    let err = render_on_cpu(
        &engines,
        &clip,
        &compositor,
        |f, _| {
            seen += 1;
            if f == 5 {
                flag.store(true, Ordering::Relaxed);
            }
            Ok(())
        },
        |_| {},
    )
    .unwrap_err();
    assert!(err.is::<cadence::frame_loop::Cancelled>(), "{err:#}");
    // Frames of the decoder batch that was running when the flag was set still arrive.
    assert!((6..=8).contains(&seen), "{seen} frames reached the sink after cancelling at frame 5");
}

/// A render prepared for windows (no whole-clip features: whisper encodes the audio as the
/// windows reach it) gives the same frames as one prepared with the whole clip's features, on a
/// committed speech clip.
#[test]
fn windowed_audio_features_give_the_whole_clip_frames() {
    let wav = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../fixtures/speech/goodnight.wav");
    assert_windowed_render_equals_whole(cadence_media::load_wav(&wav).unwrap(), 9);
}

/// The same over a clip longer than whisper's 30 s segment, with speech across the segment
/// boundary: the windows there read the second segment's features (its own log-mel, made when
/// the render reaches it) exactly as the whole-clip features have them. The rest is silence,
/// which the render bypasses, to keep the test short.
#[test]
fn windowed_render_of_a_clip_over_30_s_gives_the_whole_clip_frames() {
    let tau = 2.0 * std::f32::consts::PI;
    let samples: Vec<f32> = (0..(16000.0 * 31.2) as usize)
        .map(|i| {
            let t = i as f32 / 16000.0;
            let speaking = t < 1.0 || (28.8..30.9).contains(&t);
            if speaking {
                0.3 * (t * tau * (160.0 + 30.0 * (t * tau).sin())).sin() * (0.6 + 0.4 * (t * tau * 3.0).sin())
            } else {
                0.0
            }
        })
        .collect();
    assert_windowed_render_equals_whole(cadence_media::Audio::from_samples_16k(samples), 20);
}

/// Renders `audio` prepared whole and prepared for windows of `window` frames (stride 3,
/// batch 4) and compares every byte of every frame.
fn assert_windowed_render_equals_whole(audio: cadence_media::Audio, window: usize) {
    use cadence::frame_loop::RenderOptions;
    let engines = Engines::load(Profile::Cpu, DecoderKind::Taesd, &Device::Cpu, None).unwrap();
    let (w, h) = (320u32, 256u32);
    let px: Vec<u8> = (0..w * h * 3).map(|i| (i * 37 % 251) as u8).collect();
    let img = cadence_media::RgbImage::from_raw(w, h, px).unwrap();
    let face = cadence::avatar::face_box(&img, None).unwrap();
    // The clips here are tones that the energy detector calls speech; Silero calls them
    // silence and would bypass every frame (windowing is what is tested, not the detector).
    let vad = cadence::frame_loop::audio::Vad::Energy;
    let whole_opts = RenderOptions { batch: 4, vad, ..RenderOptions::default() };
    let windowed_opts = RenderOptions { window: Some(window), ..whole_opts.clone() };
    let whole =
        cadence::musetalk::render::prepare(&engines, &Backend::Cpu, audio.clone(), &img, face, &whole_opts).unwrap();
    let windowed =
        cadence::musetalk::render::prepare(&engines, &Backend::Cpu, audio, &img, face, &windowed_opts).unwrap();
    assert!(whole.features.is_some() && windowed.features.is_none());
    let schedule = KeyframeSchedule::fixed_stride(whole.frames, 3).unwrap();
    let render = |p, o| cadence::measure::fixtures::render_prepared(&engines, &Backend::Cpu, o, p, &schedule).unwrap();
    let (a, _) = render(&whole, &whole_opts);
    let (b, stats) = render(&windowed, &windowed_opts);
    assert_eq!(a.len(), whole.frames);
    assert_eq!(b.len(), whole.frames);
    for (i, (x, y)) in a.iter().zip(&b).enumerate() {
        assert!(x == y, "the windowed render's frame {i} differs");
    }
    assert!(stats.times.audio_ms > 0.0, "the windowed render encodes the audio itself");
}
