//! The one summary of a render: what `cadence render --json` prints and what the experiments
//! tabulate, with one definition of each time.
//!
//! - **Neural time**: the networks alone: the audio encoder, the avatar's image encoder, the
//!   UNet and the latent decoder.
//! - **End-to-end time**: from decoded inputs to the finished MP4: neural time plus everything
//!   cadence does around the networks (the compositor's per-render tables and background, SLERP
//!   infill, easing, compositing + NV12, voice activity, the rest of the frame loop) plus the
//!   video encoder.
//!   Loading the engines and reading the input files are not part of it (`engine_load_ms` is
//!   reported beside it).
//! - **Outside the networks**: end-to-end minus neural minus the video encoder.

use crate::backend::resident::Residency;
use crate::frame_loop::RenderStats;
use serde::Serialize;

/// Milliseconds per stage of one render.
#[derive(Clone, Debug, Default, Serialize)]
pub struct StageMs {
    pub audio_encoder: f64,
    pub avatar_encoder: f64,
    pub unet: f64,
    pub decoder: f64,
    pub compositor_setup: f64,
    pub expand: f64,
    pub ease: f64,
    pub composite_nv12: f64,
    /// Voice activity of the whole clip before the frame loop (a live render decides it as the
    /// stream arrives, inside `other`).
    pub vad: f64,
    pub other: f64,
    /// What the video encoder added to the render (see `StageTimes::encoder_ms`).
    pub encoder: f64,
    /// The encoder's own time where it ran beside the frame loop (not part of the sum).
    pub encoder_busy: f64,
}

/// CPU time of the render's own threads in the neural stages ([`crate::frame_loop::clock`]):
/// unlike the wall times of [`StageMs`], the same work reports the same time whatever runs
/// beside it (the video encoder's thread, another process). With several threads per stage it
/// exceeds the wall time.
#[derive(Clone, Debug, Default, Serialize)]
pub struct StageCpuMs {
    pub audio_encoder: f64,
    pub avatar_encoder: f64,
    pub unet: f64,
    pub decoder: f64,
    /// The four above.
    pub neural: f64,
}

/// Where and with what a render ran (every output says it).
#[derive(Clone, Debug, Serialize)]
pub struct RenderSetup {
    /// Where cadence's kernels ran.
    pub backend: String,
    /// Where the neural engines ran.
    pub engine_device: String,
    pub engines: String,
    pub profile: String,
    /// Synthetic (seeded) or real weights, per engine.
    pub weights: String,
    /// The network the keyframes run (summary text; `stages_ms.unet` is its time): MuseTalk's
    /// UNet, or Ditto's warping network.
    #[serde(skip)]
    pub keyframe_network: &'static str,
}

/// The times of a render's preparation before its frame loop (MuseTalk's: `musetalk::render::Prepared`).
#[derive(Clone, Debug, Default)]
pub struct PreparationTimes {
    pub audio_encoder_ms: f64,
    pub avatar_encoder_ms: f64,
    pub compositor_setup_ms: f64,
    /// The voice activity decisions of the whole clip (`--vad`).
    pub vad_ms: f64,
    pub prepare_other_ms: f64,
    /// CPU times of the two encoders ([`StageCpuMs`]), where the preparation measured them.
    pub audio_encoder_cpu_ms: Option<f64>,
    pub avatar_encoder_cpu_ms: Option<f64>,
}

/// One render's counts, times and provenance.
#[derive(Clone, Debug, Serialize)]
pub struct RenderReport {
    pub frames: usize,
    /// The video's frame rate (`25`, `30000/1001`).
    pub fps_video: String,
    pub keyframes_scheduled: usize,
    /// UNet evaluations: the scheduled keyframes minus those in bypassed silence.
    pub unet_evaluations: usize,
    pub bypassed_frames: usize,
    pub decoded_frames: usize,
    pub stages_ms: StageMs,
    /// The neural stages' CPU times, where every one was measured (MuseTalk renders of a file).
    pub stages_cpu_ms: Option<StageCpuMs>,
    pub neural_ms: f64,
    pub outside_neural_ms: f64,
    pub end_to_end_ms: f64,
    /// Outside the networks as a share of end-to-end time without the encoder, in percent.
    pub outside_neural_pct: f64,
    /// Frames per second end to end, and over the video's frame rate.
    pub render_fps: f64,
    pub realtime_factor: f64,
    pub neural_fps: f64,
    pub engine_load_ms: f64,
    pub encoder: Option<String>,
    pub mp4_bytes: Option<u64>,
    pub frames_kept_in: Residency,
    #[serde(flatten)]
    pub setup: RenderSetup,
}

impl RenderReport {
    /// The three lines `cadence render` prints.
    pub fn summary_lines(&self, output: &std::path::Path) -> [String; 3] {
        let s = &self.stages_ms;
        [
            format!(
                "cadence: {} frames ({} keyframes scheduled, {} {} evaluations, {} bypassed in silence) -> {}",
                self.frames,
                self.keyframes_scheduled,
                self.unet_evaluations,
                self.setup.keyframe_network,
                self.bypassed_frames,
                output.display()
            ),
            format!(
                "  neural {:.0} ms (audio {:.0}, avatar {:.0}, {} {:.0}, decoder {:.0}) | expand {:.1} ms, ease {:.1} ms, \
                 composite+NV12 {:.0} ms, outside the networks {:.1}% | encoder {:.0} ms",
                self.neural_ms,
                s.audio_encoder,
                s.avatar_encoder,
                self.setup.keyframe_network,
                s.unet,
                s.decoder,
                s.expand,
                s.ease,
                s.composite_nv12,
                self.outside_neural_pct,
                s.encoder
            ),
            format!(
                "  total {:.2} s: {:.1} frames/s, {:.2}x real time | {} | engines on {}: {} | frames: {} | {} profile | weights {}",
                self.end_to_end_ms / 1e3,
                self.render_fps,
                self.realtime_factor,
                self.setup.backend,
                self.setup.engine_device,
                self.setup.engines,
                self.frames_kept_in,
                self.setup.profile,
                self.setup.weights
            ),
        ]
    }

    /// The report of a render whose preparation took `prepared` (`RenderReport::new` for a MuseTalk
    /// render's `Prepared`; a live render prepares only its avatar).
    pub fn with_preparation(
        setup: RenderSetup,
        prepared: &PreparationTimes,
        stats: &RenderStats,
        video: Option<&cadence_media::VideoStats>,
        fps: cadence_media::FrameRate,
        engine_load_ms: f64,
    ) -> Self {
        let t = &stats.times;
        let stages_ms = StageMs {
            audio_encoder: prepared.audio_encoder_ms + t.audio_ms,
            avatar_encoder: prepared.avatar_encoder_ms,
            unet: t.unet_ms,
            decoder: t.decoder_ms,
            compositor_setup: prepared.compositor_setup_ms,
            expand: t.expand_ms,
            ease: t.ease_ms,
            composite_nv12: t.composite_nv12_ms,
            vad: prepared.vad_ms,
            other: t.other_ms + prepared.prepare_other_ms,
            encoder: t.encoder_ms,
            encoder_busy: t.encoder_busy_ms,
        };
        let stages_cpu_ms = match (prepared.audio_encoder_cpu_ms, prepared.avatar_encoder_cpu_ms) {
            (Some(audio), Some(avatar)) => {
                let audio_encoder = audio + t.audio_cpu_ms;
                Some(StageCpuMs {
                    audio_encoder,
                    avatar_encoder: avatar,
                    unet: t.unet_cpu_ms,
                    decoder: t.decoder_cpu_ms,
                    neural: audio_encoder + avatar + t.unet_cpu_ms + t.decoder_cpu_ms,
                })
            }
            _ => None,
        };
        let s = &stages_ms;
        let neural_ms = s.audio_encoder + s.avatar_encoder + s.unet + s.decoder;
        // The render's own audio time is inside `total_ms`.
        let end_to_end_ms = prepared.audio_encoder_ms
            + s.avatar_encoder
            + s.compositor_setup
            + s.vad
            + prepared.prepare_other_ms
            + t.total_ms;
        let outside_neural_ms = end_to_end_ms - neural_ms - s.encoder;
        let per_s = |ms: f64| stats.frames as f64 / (ms * 1e-3);
        RenderReport {
            frames: stats.frames,
            fps_video: fps.to_string(),
            keyframes_scheduled: stats.keyframes_scheduled,
            unet_evaluations: stats.keyframes_evaluated,
            bypassed_frames: stats.bypassed_frames,
            decoded_frames: stats.decoded_frames,
            neural_ms,
            outside_neural_ms,
            end_to_end_ms,
            outside_neural_pct: 100.0 * outside_neural_ms / (end_to_end_ms - s.encoder),
            render_fps: per_s(end_to_end_ms),
            realtime_factor: per_s(end_to_end_ms) / fps.hz(),
            neural_fps: per_s(neural_ms),
            engine_load_ms,
            encoder: video.map(|v| v.encoder.clone()),
            mp4_bytes: video.map(|v| v.bytes),
            frames_kept_in: stats.residency,
            stages_ms,
            stages_cpu_ms,
            setup,
        }
    }
}
