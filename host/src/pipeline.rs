//! The render pipeline, shared by `cadence render` and the experiments (one pipeline, not two):
//! audio features -> keyframe schedule with silence bypass -> UNet on the keyframes that are not
//! bypassed -> one-launch SLERP expansion -> Hermite easing toward the rest latent -> decoder
//! (bypassed frames reuse the decoded rest frame) -> compositing fused with NV12 -> a sink
//! (the encoder). Every stage is timed.
//!
//! Between the stages the frames are candle tensors on the engines' device ([`crate::resident`]):
//! with candle's CUDA engines they stay on the GPU from the UNet to the encoder's input, on the
//! CPU they are host memory, and the loop below is the same for both.

use crate::composite::Compositor;
use crate::elem::{Method, RgbRange};
pub use crate::features::FrameFeatures;
use crate::resident::{self, FrameBuffer, Residency};
use crate::schedule::{bypassed_frames, speech_distance, KeyframeSchedule};
use crate::Backend;
use anyhow::{ensure, Context, Result};
use cadence_engines::{
    AudioEncoder, Batch, Device, Engine, ImageEncoder, KeyframeModel, LatentDecoder, ModelKind, ModelsDir,
    MuseTalkUnet, Profile, SdVae, Taesd, Tensor, WeightsSource, WhisperAudio, DEFAULT_SEED,
};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Instant;

pub use cadence_engines::{FACE_SIDE, LATENT_DIM};

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum, serde::Serialize)]
pub enum DecoderKind {
    /// TAESD (tiny autoencoder): fast, output in [0, 1].
    Taesd,
    /// The full SD VAE decoder (sd-vae-ft-mse), output in [-1, 1].
    SdVae,
}

impl DecoderKind {
    /// The decoder and the matching image encoder this choice loads.
    pub fn models(self) -> [ModelKind; 2] {
        match self {
            DecoderKind::Taesd => [ModelKind::TaesdDecoder, ModelKind::TaesdEncoder],
            DecoderKind::SdVae => [ModelKind::SdVaeDecoder, ModelKind::SdVaeEncoder],
        }
    }
}

/// The engines a render loads with `decoder` (what `cadence models check` checks by default).
pub fn render_models(decoder: DecoderKind) -> [ModelKind; 4] {
    let [dec, enc] = decoder.models();
    [ModelKind::WhisperTiny, ModelKind::MuseTalkUnet, dec, enc]
}

/// The engines of one render, loaded once.
pub struct Engines {
    pub audio: WhisperAudio,
    pub unet: MuseTalkUnet,
    pub decoder: Box<dyn LatentDecoder>,
    pub image_encoder: Box<dyn ImageEncoder>,
    pub decoder_kind: DecoderKind,
    pub profile: Profile,
    /// Where the engines run (and where a render keeps its frames).
    pub device: Device,
    /// The audio encoder's (1, window, features) for one 40 ms frame of zeros, what the rest
    /// latent is predicted from. Whisper pads every input to its 30 s window, so this costs as
    /// much as encoding a whole clip; it depends only on the engines, so it is part of loading.
    pub silence_window: Batch,
}

impl Engines {
    /// Every engine's weights come from `models` (an engine the folder lacks is an error, never
    /// a synthetic stand-in), or all are seeded synthetic weights when no folder was asked for
    /// (`--models`, [`crate::args::EngineArgs`]). `weights_summary` says which.
    pub fn load(
        profile: Profile,
        decoder_kind: DecoderKind,
        device: &Device,
        models: Option<&ModelsDir>,
    ) -> Result<Self> {
        let w = |kind: ModelKind| -> Result<WeightsSource> {
            Ok(match models {
                Some(dir) => dir.weights(kind)?,
                None => WeightsSource::Synthetic { seed: DEFAULT_SEED },
            })
        };
        let audio = WhisperAudio::new(profile, &w(ModelKind::WhisperTiny)?, device).context("loading whisper-tiny")?;
        let unet =
            MuseTalkUnet::new(profile, &w(ModelKind::MuseTalkUnet)?, device).context("loading the MuseTalk UNet")?;
        let [dec, enc] = decoder_kind.models();
        let (decoder, image_encoder): (Box<dyn LatentDecoder>, Box<dyn ImageEncoder>) = match decoder_kind {
            DecoderKind::Taesd => (
                Box::new(Taesd::decoder(profile, &w(dec)?, device).context("loading the TAESD decoder")?),
                Box::new(Taesd::encoder(profile, &w(enc)?, device).context("loading the TAESD encoder")?),
            ),
            DecoderKind::SdVae => (
                Box::new(SdVae::decoder(profile, &w(dec)?, device).context("loading the SD VAE decoder")?),
                Box::new(SdVae::encoder(profile, &w(enc)?, device).context("loading the SD VAE encoder")?),
            ),
        };
        let s = audio.encode_audio(&vec![0.0f32; 16000 / 25], 25.0).context("encoding one frame of silence")?;
        let silence_window = Batch::new(vec![1, s.shape[1], s.shape[2]], s.data[..s.shape[1] * s.shape[2]].to_vec())?;
        Ok(Self { audio, unet, decoder, image_encoder, decoder_kind, profile, device: device.clone(), silence_window })
    }

    fn all(&self) -> [&dyn Engine; 4] {
        [&self.audio, &self.unet, self.decoder.as_ref(), self.image_encoder.as_ref()]
    }

    /// The common label (e.g. `synthetic(seed=13295116)`) when every engine has the same source;
    /// `real: <engine>=<file>, ...` when all are real files; else `mixed: ...`.
    pub fn weights_summary(&self) -> String {
        let labels: Vec<String> = self.all().iter().map(|e| e.weights_label()).collect();
        if labels.iter().all(|l| l == &labels[0]) {
            labels[0].clone()
        } else if labels.iter().all(|l| l.starts_with("real")) {
            let parts: Vec<String> = self
                .all()
                .iter()
                .map(|e| {
                    let l = e.weights_label();
                    let file = l.strip_prefix("real(").and_then(|f| f.strip_suffix(')')).unwrap_or(&l).to_string();
                    format!("{}={file}", e.model())
                })
                .collect();
            format!("real: {}", parts.join(", "))
        } else {
            let parts: Vec<String> =
                self.all().iter().map(|e| format!("{}={}", e.model(), e.weights_label())).collect();
            format!("mixed: {}", parts.join(", "))
        }
    }

    pub fn describe(&self) -> String {
        format!("{} + {} + {} (f32)", self.audio.describe(), self.unet.describe(), self.decoder.describe())
    }

    pub fn decoder_range(&self) -> RgbRange {
        if self.decoder.output_range().0 < 0.0 {
            RgbRange::Signed
        } else {
            RgbRange::Unit
        }
    }
}

/// One avatar frame's latents, computed once per avatar (a still image has one frame, a video
/// avatar one per frame: output frame k uses avatar frame [`cycle_index`]`(k, frames)`).
pub struct AvatarLatents {
    /// The full face crop encoded.
    pub reference: Vec<f32>,
    /// The crop with its lower half blacked out (MuseTalk's inpainting mask), encoded.
    pub masked: Vec<f32>,
    /// The engine's output for silence: the closed-mouth rest state easing blends toward.
    pub rest: Vec<f32>,
    /// `rest` decoded: reused for every bypassed frame.
    pub rest_rgb: Vec<f32>,
}

/// `face`: planar 3 x 256 x 256 in [0, 1].
pub fn prepare_avatar(engines: &Engines, face: &[f32]) -> Result<AvatarLatents> {
    ensure!(face.len() == 3 * FACE_SIDE * FACE_SIDE, "face crop must be 3x{FACE_SIDE}x{FACE_SIDE}");
    let (lo, hi) = engines.image_encoder.input_range();
    let to_range = |v: f32| lo + (hi - lo) * v;
    let mut both: Vec<f32> = face.iter().map(|&v| to_range(v)).collect();
    let mut masked = both.clone();
    for c in 0..3 {
        masked[c * FACE_SIDE * FACE_SIDE + (FACE_SIDE / 2) * FACE_SIDE..(c + 1) * FACE_SIDE * FACE_SIDE]
            .fill(to_range(0.0));
    }
    both.extend_from_slice(&masked);
    let enc = engines.image_encoder.encode(&Batch::new(vec![2, 3, FACE_SIDE, FACE_SIDE], both)?)?;
    ensure!(enc.data.len() == 2 * LATENT_DIM, "image encoder returned shape {:?}", enc.shape);
    let (reference, masked) = (enc.data[..LATENT_DIM].to_vec(), enc.data[LATENT_DIM..].to_vec());
    // Rest state: the UNet's answer to silence (one 40 ms frame of zeros).
    let rest = engines.unet.predict(&unet_input(&masked, &reference, 1), &engines.silence_window)?.data;
    let rest_rgb = engines.decoder.decode(&Batch::new(vec![1, 4, 32, 32], rest.clone())?)?.data;
    Ok(AvatarLatents { reference, masked, rest, rest_rgb })
}

fn unet_input(masked: &[f32], reference: &[f32], batch: usize) -> Batch {
    let mut data = Vec::with_capacity(batch * 2 * LATENT_DIM);
    for _ in 0..batch {
        data.extend_from_slice(masked);
        data.extend_from_slice(reference);
    }
    Batch { shape: vec![batch, 8, 32, 32], data }
}

/// The avatar frame output frame `k` shows, for an avatar of `frames` frames: MuseTalk's cycle
/// (`frame_list_cycle = frame_list + frame_list[::-1]` in its `inference.py` and
/// `realtime_inference.py`), the frames forward then backward, each end shown twice:
/// 0, 1, .., n-1, n-1, .., 1, 0, 0, 1, ... A still image (one frame) is frame 0 throughout.
pub fn cycle_index(k: usize, frames: usize) -> usize {
    assert!(frames > 0, "an avatar has at least one frame");
    let i = k % (2 * frames);
    if i < frames {
        i
    } else {
        2 * frames - 1 - i
    }
}

#[derive(Clone, Debug)]
pub struct RenderOptions {
    pub fps: cadence_media::FrameRate,
    /// Frames of Hermite easing between speech and rest (4 gives 1, 0.84375, 0.5, 0.15625, 0).
    pub ramp: u32,
    /// Engine batch size.
    pub batch: usize,
    pub method: Method,
    /// Frames per render window ([`render_frames`]); `None` renders the clip as one window.
    /// The output is the same whatever the window; memory and the time to the first frame
    /// grow with it.
    pub window: Option<usize>,
    /// Set from another thread to stop the render: it is checked before every engine batch
    /// (UNet and decoder), and a cancelled render returns the error [`Cancelled`].
    pub cancel: Option<Arc<AtomicBool>>,
}

impl Default for RenderOptions {
    fn default() -> Self {
        Self {
            fps: cadence_media::FrameRate::whole(25),
            ramp: 4,
            batch: 8,
            method: Method::Slerp,
            window: None,
            cancel: None,
        }
    }
}

/// The render window `cadence render` and the server use unless told otherwise: a few seconds
/// bound memory and the wait for the first frame, and cost nothing in throughput
/// (`results/streaming.csv`).
pub const DEFAULT_WINDOW_SECONDS: f64 = 4.0;

/// A window of `seconds` at `fps` as frames (at least one); `None` (the clip as one window) for
/// 0 seconds.
pub fn window_frames(seconds: f64, fps: cadence_media::FrameRate) -> Option<usize> {
    (seconds > 0.0).then(|| ((seconds * fps.hz()).ceil() as usize).max(1))
}

impl RenderOptions {
    fn check_cancelled(&self) -> Result<()> {
        match &self.cancel {
            Some(flag) if flag.load(Ordering::Relaxed) => Err(Cancelled.into()),
            _ => Ok(()),
        }
    }
}

/// The error of a render stopped through [`RenderOptions::cancel`] (find it with
/// `anyhow::Error::is::<Cancelled>()`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Cancelled;

impl std::fmt::Display for Cancelled {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("the render was cancelled")
    }
}

impl std::error::Error for Cancelled {}

/// Milliseconds per stage.
#[derive(Clone, Debug, Default, serde::Serialize)]
pub struct StageTimes {
    /// The audio encoder inside the render loop: features made as the windows reach them
    /// (0 when the whole clip's features were made before the render).
    pub audio_ms: f64,
    pub unet_ms: f64,
    pub expand_ms: f64,
    pub ease_ms: f64,
    pub decoder_ms: f64,
    pub composite_nv12_ms: f64,
    /// The frame loop's time on the encoder: handing frames over (waiting when the encoder is
    /// behind) and, for an MP4, waiting for it to finish. Where the encoder runs beside the loop
    /// (`render::render_clip` to an MP4) this is what it added to the render, not its own work.
    pub encoder_ms: f64,
    /// The encoder thread's own time where it runs beside the frame loop (0 where it runs inline).
    pub encoder_busy_ms: f64,
    pub other_ms: f64,
    pub total_ms: f64,
}

#[derive(Clone, Debug, serde::Serialize)]
pub struct RenderStats {
    pub frames: usize,
    pub keyframes_scheduled: usize,
    /// Keyframes the UNet actually ran on (scheduled minus bypassed).
    pub keyframes_evaluated: usize,
    pub bypassed_frames: usize,
    pub decoded_frames: usize,
    /// Where the frames were kept between the stages.
    pub residency: Residency,
    pub times: StageTimes,
}

fn ms(t: Instant) -> f64 {
    t.elapsed().as_secs_f64() * 1e3
}

/// Renders every frame and hands each NV12 frame to `sink` in order (the sink's time is
/// recorded as the encoder's). `features`: the audio encoder's (50, 384) window of every frame;
/// `speech`: voice activity per frame.
///
/// The clip is rendered in windows of about `opts.window` frames ([`RenderOptions::window`]):
/// each window's keyframes go through the UNet, its frames are expanded, eased, decoded and
/// handed to the sink before the next window's UNet work starts, so the first frame leaves
/// after one window's work and the frames in flight are bounded by a window, not by the clip. The output is
/// byte-identical whatever the window, because every engine call and every kernel sees exactly
/// the inputs of the whole-clip render:
/// - the UNet runs the same batches (consecutive keyframes that are not bypassed, `batch` at a
///   time); a window ends at a keyframe and takes as many batches as its keyframes need;
/// - windows share their boundary keyframe, and each frame is expanded from the keyframe
///   interval that owns it in the whole clip (`interval_frames`: a boundary keyframe belongs to
///   the interval it starts), with positions that depend only on differences of frame indices;
/// - the decoder runs the same batches: a run of frames that would cross the end of a window
///   waits for the next one.
#[allow(clippy::too_many_arguments)]
pub fn render_frames(
    engines: &Engines,
    backend: &Backend,
    opts: &RenderOptions,
    features: &dyn FrameFeatures,
    speech: &[bool],
    schedule: &KeyframeSchedule,
    avatar: &[AvatarLatents],
    compositors: &[Compositor],
    sink: impl FnMut(usize, &[u8]) -> Result<()>,
    progress: impl FnMut(usize),
) -> Result<RenderStats> {
    let part = ClipPart { first_frame: 0, distance: &speech_distance(speech) };
    render_part(engines, backend, opts, features, part, schedule, avatar, compositors, sink, progress)
}

/// Where the frames of a [`render_part`] sit in a longer stream (a live render renders its
/// stream a part at a time).
#[derive(Clone, Copy)]
pub struct ClipPart<'a> {
    /// The stream's index of the part's frame 0: the avatar's cycle ([`cycle_index`]) goes on
    /// from it. The sink and `features` still count frames from 0.
    pub first_frame: usize,
    /// Per frame of the part, frames to the nearest speech in the stream
    /// ([`crate::schedule::speech_distance`] of the stream, which may see speech before and
    /// after the part).
    pub distance: &'a [u32],
}

/// [`render_frames`] of a part of a longer stream ([`ClipPart`]); see there.
#[allow(clippy::too_many_arguments)]
pub fn render_part(
    engines: &Engines,
    backend: &Backend,
    opts: &RenderOptions,
    features: &dyn FrameFeatures,
    part: ClipPart,
    schedule: &KeyframeSchedule,
    avatar: &[AvatarLatents],
    compositors: &[Compositor],
    mut sink: impl FnMut(usize, &[u8]) -> Result<()>,
    mut progress: impl FnMut(usize),
) -> Result<RenderStats> {
    let t_total = Instant::now();
    let mut times = StageTimes::default();
    let n = schedule.n_frames();
    let distance = part.distance;
    ensure!(
        distance.len() == n && features.frames() == n,
        "audio features, activity and schedule disagree on the frame count"
    );
    ensure!(opts.batch > 0, "batch size must be at least 1");
    ensure!(opts.window != Some(0), "the render window must hold at least one frame");
    ensure!(
        !avatar.is_empty() && avatar.len() == compositors.len(),
        "the avatar has {} frames of latents and {} compositors",
        avatar.len(),
        compositors.len()
    );
    // Output frame k shows avatar frame `of(k)`: its reference latent for the UNet, its rest
    // latent for the easing, its compositor (background and face box).
    let of = |k: usize| cycle_index(part.first_frame + k, avatar.len());
    ensure!(
        compositors.iter().all(|c| (c.width, c.height) == (compositors[0].width, compositors[0].height)),
        "the avatar's frames differ in size"
    );
    let (win, dim_a) = features.frame_shape();

    // Silence: distance to speech -> easing weight; weight 0 frames bypass every network.
    let t = Instant::now();
    let bypassed = bypassed_frames(distance, opts.ramp);
    let keys = schedule.keyframes();
    let m = keys.len();
    let evaluate: Vec<usize> = (0..m).filter(|&j| !bypassed[keys[j] as usize]).collect();
    let unet_batches: Vec<&[usize]> = evaluate.chunks(opts.batch).collect();
    times.other_ms += ms(t);

    let dev = &engines.device;
    let residency = resident::residency(backend, dev);
    // A still avatar's UNet input is the same for every keyframe: made once, narrowed per batch.
    let still_latents = match avatar {
        [a] => Some(unet_input(&a.masked, &a.reference, opts.batch.min(evaluate.len()).max(1)).into_tensor(dev)?),
        _ => None,
    };
    let rest_latents: Vec<Tensor> =
        avatar.iter().map(|a| Tensor::from_slice(&a.rest, (1, 4, 32, 32), dev)).collect::<candle_core::Result<_>>()?;
    let range = engines.decoder_range();
    let rest_rgb: Vec<Tensor> = avatar
        .iter()
        .map(|a| Tensor::from_slice(&a.rest_rgb, (1, 3, FACE_SIDE, FACE_SIDE), dev))
        .collect::<candle_core::Result<_>>()?;
    // One frame buffer for the whole render: outside the face box it keeps the background (of
    // the avatar frame it was last composited with).
    let mut frame_nv12 = FrameBuffer::new(&compositors[0]);

    // Keyframe latents from the UNet (bypassed keyframes are the rest latent), kept from the
    // current window's first keyframe on.
    let mut key_latents: Vec<Option<Tensor>> = vec![None; m];
    let mut next_batch = 0;
    // Expanded, eased latents of frames [pending_from, produced) not decoded yet.
    let mut pending: Option<Tensor> = None;
    let mut pending_from = 0;
    let mut decoded_frames = 0;
    let mut first_key = 0; // the current window's first keyframe (index into `keys`)
    let mut produced = 0; // frames expanded so far
    while produced < n {
        // The window ends at the first keyframe at least `window` frames after its start (at
        // least one keyframe interval); the last window runs to the end of the clip.
        let last_key = match opts.window {
            _ if m == 1 => 0,
            None => m - 1,
            Some(w) => (first_key + 1..m).find(|&j| keys[j] as usize >= produced + w).unwrap_or(m - 1),
        };
        let is_last = last_key == m - 1;
        let end = if is_last { n } else { keys[last_key] as usize };

        // UNet batches until every keyframe of the window is known (a batch may reach into the
        // next window: its latents wait there).
        let t = Instant::now();
        let mut audio_ms = 0.0;
        while next_batch < unet_batches.len() && unet_batches[next_batch][0] <= last_key {
            opts.check_cancelled()?;
            let chunk = unet_batches[next_batch];
            let b = chunk.len();
            let frames: Vec<usize> = chunk.iter().map(|&j| keys[j] as usize).collect();
            let mut audio = Vec::with_capacity(b * win * dim_a);
            let t_audio = Instant::now();
            features.gather(&frames, &mut audio)?;
            audio_ms += ms(t_audio);
            ensure!(audio.len() == b * win * dim_a, "the audio features of {b} frames have {} values", audio.len());
            let audio = Tensor::from_vec(audio, (b, win, dim_a), dev)?;
            let latents = match &still_latents {
                Some(t) => t.narrow(0, 0, b)?,
                None => {
                    let mut data = Vec::with_capacity(b * 2 * LATENT_DIM);
                    for &f in &frames {
                        let a = &avatar[of(f)];
                        data.extend_from_slice(&a.masked);
                        data.extend_from_slice(&a.reference);
                    }
                    Tensor::from_vec(data, (b, 8, 32, 32), dev)?
                }
            };
            let out = engines.unet.predict_tensor(&latents, &audio)?;
            ensure!(out.dims() == [b, 4, 32, 32], "the UNet returned shape {:?}", out.dims());
            for (i, &j) in chunk.iter().enumerate() {
                key_latents[j] = Some(out.narrow(0, i, 1)?);
            }
            next_batch += 1;
            progress(0);
        }
        let window_keys: Vec<Tensor> = (first_key..=last_key)
            .map(|j| key_latents[j].clone().unwrap_or_else(|| rest_latents[of(keys[j] as usize)].clone()))
            .collect();
        let window_keys = Tensor::cat(&window_keys, 0)?;
        // Wait for the device so that stage times are the stages' and not their launches'.
        dev.synchronize()?;
        times.unet_ms += ms(t) - audio_ms;
        times.audio_ms += audio_ms;

        // Expand the window: its keyframes, re-indexed from the window's first frame, over its
        // frames plus the last keyframe (which the next window starts from and owns).
        let base = produced;
        let span = if is_last { n - base } else { end + 1 - base };
        let sub_keys: Vec<usize> = (first_key..=last_key).map(|j| keys[j] as usize - base).collect();
        let sub = KeyframeSchedule::explicit(span, &sub_keys)?;
        // The easing target: the still avatar's rest latent, or each frame's avatar frame's.
        let rest_per_frame: Vec<f32>;
        let rest: &[f32] = match avatar {
            [a] => &a.rest,
            _ => {
                rest_per_frame = (base..base + span).flat_map(|f| avatar[of(f)].rest.iter().copied()).collect();
                &rest_per_frame
            }
        };
        let infill = resident::Infill {
            schedule: &sub,
            method: opts.method,
            rest,
            distance: &distance[base..base + span],
            ramp: opts.ramp,
        };
        let (latents, expand_ms, ease_ms) = resident::expand_eased(backend, &window_keys, &infill)?;
        times.expand_ms += expand_ms;
        times.ease_ms += ease_ms;
        let latents = latents.narrow(0, 0, end - base)?;
        pending = Some(match pending.take() {
            Some(p) => Tensor::cat(&[&p, &latents], 0)?,
            None => latents,
        });
        produced = end;
        for slot in &mut key_latents[first_key..last_key] {
            *slot = None;
        }
        first_key = last_key;

        // Decode (batches of non-bypassed frames), composite + NV12, hand to the sink, in order.
        let mut f = pending_from;
        while f < produced {
            // A run of up to `batch` consecutive frames that need decoding, or one bypassed
            // frame (the whole-clip rule: a run that would cross the window's end waits).
            let g = if bypassed[f] {
                f + 1
            } else {
                (f..n).take(opts.batch).take_while(|&x| !bypassed[x]).last().unwrap() + 1
            };
            if g > produced {
                break;
            }
            let rgb = if bypassed[f] {
                None
            } else {
                opts.check_cancelled()?;
                let t = Instant::now();
                let b = g - f;
                let batch = pending.as_ref().expect("frames were expanded").narrow(0, f - pending_from, b)?;
                let out = engines.decoder.decode_tensor(&batch)?;
                ensure!(out.dims() == [b, 3, FACE_SIDE, FACE_SIDE], "the decoder returned shape {:?}", out.dims());
                dev.synchronize()?;
                times.decoder_ms += ms(t);
                decoded_frames += b;
                Some(out)
            };
            for (i, frame) in (f..g).enumerate() {
                let t = Instant::now();
                let a = of(frame);
                match &rgb {
                    Some(crops) => frame_nv12.compose(backend, compositors, a, crops, i, range)?,
                    // Inside a run of bypassed frames showing the same avatar frame, the buffer
                    // already holds its rest frame.
                    None if frame > 0 && bypassed[frame - 1] && of(frame - 1) == a => {}
                    None => frame_nv12.compose(backend, compositors, a, &rest_rgb[a], 0, range)?,
                }
                times.composite_nv12_ms += ms(t);
                let t = Instant::now();
                sink(frame, frame_nv12.host()).with_context(|| format!("encoding frame {frame}"))?;
                times.encoder_ms += ms(t);
                progress(1);
            }
            f = g;
        }
        let p = pending.take().expect("frames were expanded");
        pending = (f < produced).then(|| p.narrow(0, f - pending_from, produced - f)).transpose()?;
        pending_from = f;
    }
    times.total_ms = ms(t_total);
    Ok(RenderStats {
        frames: n,
        keyframes_scheduled: m,
        keyframes_evaluated: evaluate.len(),
        bypassed_frames: bypassed.iter().filter(|&&b| b).count(),
        decoded_frames,
        residency,
        times,
    })
}
