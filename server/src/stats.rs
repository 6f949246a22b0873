//! A render's final statistics: one source for `/generate`'s headers (`X-Inference-FPS`, ...,
//! `Server-Timing`) and for the job record of a job or a streamed render (whose headers are sent
//! before the render ends).

use crate::render_job::Rendered;
use axum::http::{HeaderName, HeaderValue};
use serde::Serialize;

/// Server-Timing entries: (name, milliseconds, description).
pub type Timing = Vec<(&'static str, f64, Option<&'static str>)>;

#[derive(Clone, Debug, Serialize)]
pub struct FinalStats {
    /// Frames over the end-to-end render time (the source's `X-Inference-FPS`).
    pub inference_fps: f64,
    pub stride: usize,
    /// `inference_fps` over the clip's frame rate.
    pub realtime_factor: f64,
    pub frames: usize,
    pub keyframes_evaluated: usize,
    pub bypassed_frames: usize,
    /// Frames the decoder ran on: every frame not bypassed with `latent` infill, the evaluated
    /// keyframes only with `image` infill.
    pub decoded_frames: usize,
    pub weights: String,
    /// Milliseconds from the start of the render to the first frame encoded, and to the first
    /// whole fragment (streamed renders).
    pub first_frame_ms: Option<f64>,
    pub first_fragment_ms: Option<f64>,
    pub bytes: u64,
    /// The `Server-Timing` header's value: the request's stages and the render's.
    pub server_timing: String,
}

impl FinalStats {
    /// The statistics of `r`; `timing` holds the request's stages before the render (upload,
    /// validate, queue, ...), to which the render's stages and `total_ms` are added.
    pub fn new(r: &Rendered, stride: usize, clip_fps: f64, mut timing: Timing, total_ms: f64) -> Self {
        let rep = &r.report;
        let s = &rep.stages_ms;
        if r.engine_load_ms > 0.0 {
            timing.push(("engine_load", r.engine_load_ms, None));
        }
        timing.push(("avatar", r.avatar_ms, Some(if r.avatar_cached { "cached" } else { "prepared" })));
        timing.extend([
            ("audio_encoder", s.audio_encoder, None),
            ("unet", s.unet, None),
            ("decoder", s.decoder, None),
            ("composite", s.composite_nv12 + s.expand + s.ease, None),
            ("encoder", s.encoder, None),
            ("render", rep.end_to_end_ms, None),
            ("total", total_ms, None),
        ]);
        Self {
            inference_fps: rep.render_fps,
            stride,
            realtime_factor: rep.render_fps / clip_fps,
            frames: rep.frames,
            keyframes_evaluated: rep.unet_evaluations,
            bypassed_frames: rep.bypassed_frames,
            decoded_frames: rep.decoded_frames,
            weights: rep.setup.weights.clone(),
            first_frame_ms: r.first_frame_ms,
            first_fragment_ms: r.first_fragment_ms,
            bytes: r.bytes,
            server_timing: server_timing(&timing),
        }
    }

    /// `/generate`'s headers: the source's (`%.2f`, `%.2fx`) and cadence's.
    pub fn headers(&self) -> [(HeaderName, HeaderValue); 9] {
        let h = |name: &'static str| HeaderName::from_static(name);
        [
            (h("x-inference-fps"), header_text(&format!("{:.2}", self.inference_fps))),
            (h("x-stride"), HeaderValue::from(self.stride)),
            (h("x-realtime-factor"), header_text(&format!("{:.2}x", self.realtime_factor))),
            (h("x-frames"), HeaderValue::from(self.frames)),
            (h("x-keyframes-evaluated"), HeaderValue::from(self.keyframes_evaluated)),
            (h("x-bypassed-frames"), HeaderValue::from(self.bypassed_frames)),
            (h("x-decoded-frames"), HeaderValue::from(self.decoded_frames)),
            (h("x-weights"), header_text(&self.weights)),
            (h("server-timing"), header_text(&self.server_timing)),
        ]
    }
}

/// Header-safe text: anything but visible ASCII and spaces becomes '?'.
pub fn header_text(s: &str) -> HeaderValue {
    let clean: String = s.chars().map(|c| if c.is_ascii_graphic() || c == ' ' { c } else { '?' }).collect();
    HeaderValue::from_str(&clean).unwrap_or(HeaderValue::from_static("?"))
}

pub fn server_timing(timing: &Timing) -> String {
    let entries: Vec<String> = timing
        .iter()
        .map(|(name, dur, desc)| match desc {
            Some(d) => format!("{name};dur={dur:.1};desc=\"{d}\""),
            None => format!("{name};dur={dur:.1}"),
        })
        .collect();
    entries.join(", ")
}
