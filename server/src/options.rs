//! The render options of a request, as text (multipart fields; JSON values turned into text),
//! checked into the settings of a render. Every parser is the CLI's where the CLI has one.

use crate::error::ApiError;
use cadence::args::{parse_frame_rate, EncoderArg, VadKind};
use cadence::avatar::faces::{parse_face_box_arg, DetectOptions, FaceSpec};
use cadence::avatar::FaceBoxArg;
use cadence::musetalk::{DecoderKind, MuseTalkInfill};
use cadence::Method;
use cadence_media::{EncoderKind, FrameRate};
use clap::ValueEnum;

/// The text fields `/generate` takes besides the files.
pub const TEXT_FIELDS: [&str; 14] = [
    "stride",
    "decoder",
    "keyframes",
    "method",
    "infill",
    "ramp",
    "fps",
    "encoder",
    "face_box",
    "face_boxes",
    "face_index",
    "bbox_shift",
    "avatar_id",
    "vad",
];

/// Longest text field accepted (a keyframe list of a long clip fits, and the face boxes of a
/// video avatar's 1000 frames).
pub const MAX_TEXT_BYTES: usize = 64 << 10;

#[derive(Default, Debug, Clone)]
pub struct RawOptions {
    values: Vec<(&'static str, String)>,
}

#[derive(Debug, Clone)]
pub struct Settings {
    pub stride: usize,
    pub decoder: DecoderKind,
    pub keyframes: Option<String>,
    pub method: Method,
    /// What the frames between keyframes are blended from: latents (the decoder on every frame
    /// not bypassed) or decoded keyframe crops (the decoder on keyframes only).
    pub infill: MuseTalkInfill,
    pub ramp: u32,
    pub fps: FrameRate,
    pub encoder: EncoderKind,
    /// `x,y,w,h` or `center` (the CLI's `--face-box`); absent, with no `face_boxes`: found by
    /// the detector.
    pub face_box: Option<FaceBoxArg>,
    /// A video avatar's face boxes, one `x,y,w,h` line per frame (the CLI's `--face-boxes`
    /// file), checked with the video.
    pub face_boxes: Option<String>,
    /// Which face the detector's box follows (the CLI's `--face-index`).
    pub face_index: usize,
    /// MuseTalk's `bbox_shift` (the CLI's `--bbox-shift`).
    pub bbox_shift: i32,
    pub avatar_id: Option<String>,
    /// The voice activity detector (`silero`, `energy` or `digital`); absent: the server's `--vad`.
    pub vad: Option<VadKind>,
}

impl RawOptions {
    /// Records text field `name`; an unknown or repeated field is refused (a typo must not pass
    /// silently as a default).
    pub fn set(&mut self, name: &str, value: String) -> Result<(), ApiError> {
        let Some(&known) = TEXT_FIELDS.iter().find(|&&f| f == name) else {
            return Err(ApiError::invalid("unknown_field", format!("unknown field '{name}'")));
        };
        if self.get(known).is_some() {
            return Err(ApiError::invalid("duplicate_field", format!("field '{name}' is given twice")));
        }
        self.values.push((known, value));
        Ok(())
    }

    /// The fields as sent (a job handed to another replica carries them).
    pub fn pairs(&self) -> impl Iterator<Item = (&str, &str)> {
        self.values.iter().map(|(k, v)| (*k, v.as_str()))
    }

    pub fn get(&self, name: &str) -> Option<&str> {
        self.values.iter().find(|(k, _)| *k == name).map(|(_, v)| v.trim())
    }

    pub fn settings(&self) -> Result<Settings, ApiError> {
        let bad = |field: &str, msg: String| ApiError::invalid("invalid_option", format!("{field}: {msg}"));
        let stride = match self.get("stride") {
            None => 1,
            Some(s) => match s.parse::<u32>() {
                Ok(0) => return Err(bad("stride", "must be at least 1 (1 runs the UNet on every frame)".into())),
                Ok(k) => k as usize,
                Err(_) => return Err(bad("stride", format!("'{s}' is not a whole number"))),
            },
        };
        let decoder = match self.get("decoder") {
            None => DecoderKind::Taesd,
            Some(s) => parse_decoder(s).ok_or_else(|| bad("decoder", format!("'{s}': expected taesd or full_vae")))?,
        };
        let method = match self.get("method") {
            None => Method::Slerp,
            Some(s) => {
                Method::from_str(s, true).map_err(|_| bad("method", format!("'{s}': expected slerp or lerp")))?
            }
        };
        let infill = match self.get("infill") {
            None => MuseTalkInfill::Latent,
            Some(s) => MuseTalkInfill::from_str(s, true)
                .map_err(|_| bad("infill", format!("'{s}': expected latent or image")))?,
        };
        let ramp = match self.get("ramp") {
            None => 4,
            Some(s) => s
                .parse::<u32>()
                .ok()
                .filter(|&r| r <= 250)
                .ok_or_else(|| bad("ramp", format!("'{s}' is not a whole number of frames from 0 to 250")))?,
        };
        let fps = match self.get("fps") {
            None => FrameRate::whole(25),
            Some(s) => parse_frame_rate(s).map_err(|e| bad("fps", e))?,
        };
        let encoder = match self.get("encoder") {
            None => EncoderKind::OpenH264,
            Some(s) => EncoderArg::from_str(s, true)
                .map_err(|_| bad("encoder", format!("'{s}': expected openh264, x264 or nvenc")))?
                .available()
                .map_err(|e| bad("encoder", e.to_string()))?,
        };
        let face_box =
            self.get("face_box").map(|s| parse_face_box_arg(s).map_err(|e| bad("face_box", e))).transpose()?;
        let face_index = match self.get("face_index") {
            None => 0,
            Some(s) => s
                .parse::<usize>()
                .map_err(|_| bad("face_index", format!("'{s}' is not a whole number (0 is the largest face)")))?,
        };
        let bbox_shift = match self.get("bbox_shift") {
            None => 0,
            Some(s) => {
                s.parse::<i32>().map_err(|_| bad("bbox_shift", format!("'{s}' is not a whole number of pixels")))?
            }
        };
        if (face_box.is_some() || self.get("face_boxes").is_some()) && (face_index != 0 || bbox_shift != 0) {
            return Err(bad(
                "face_index",
                "face_index and bbox_shift choose and crop a face the detector finds; with face_box or face_boxes the box is given".into(),
            ));
        }
        let avatar_id = self.get("avatar_id").map(str::to_string);
        let vad = self
            .get("vad")
            .map(|s| {
                VadKind::from_str(s, true).map_err(|_| bad("vad", format!("'{s}': expected silero, energy or digital")))
            })
            .transpose()?;
        Ok(Settings {
            stride,
            decoder,
            keyframes: self.get("keyframes").map(str::to_string),
            method,
            infill,
            ramp,
            fps,
            encoder,
            face_box,
            face_boxes: self.get("face_boxes").map(str::to_string),
            face_index,
            bbox_shift,
            avatar_id,
            vad,
        })
    }
}

impl Settings {
    /// Where the avatar's face boxes come from; `boxes_file` holds `face_boxes`' text when given.
    pub fn face_spec(&self, boxes_file: Option<std::path::PathBuf>) -> Result<FaceSpec, ApiError> {
        let detect = DetectOptions { face_index: self.face_index, bbox_shift: self.bbox_shift, ..Default::default() };
        FaceSpec::from_flags(self.face_box, boxes_file, detect)
            .map_err(|e| ApiError::invalid("conflicting_fields", format!("{e:#}").replace("--face-", "face_")))
    }

    /// Whether any face field was given (a registered avatar takes none).
    pub fn any_face_field(&self) -> bool {
        self.face_box.is_some() || self.face_boxes.is_some() || self.face_index != 0 || self.bbox_shift != 0
    }
}

/// `taesd`, or the SD VAE as the source names it (`full_vae`) or as the CLI does (`sd-vae`).
pub fn parse_decoder(s: &str) -> Option<DecoderKind> {
    match s.to_ascii_lowercase().as_str() {
        "taesd" => Some(DecoderKind::Taesd),
        "full_vae" | "full-vae" | "sd-vae" | "sd_vae" => Some(DecoderKind::SdVae),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn raw(pairs: &[(&str, &str)]) -> RawOptions {
        let mut r = RawOptions::default();
        for (k, v) in pairs {
            r.set(k, v.to_string()).unwrap();
        }
        r
    }

    #[test]
    fn defaults_are_the_sources() {
        let s = raw(&[]).settings().unwrap();
        assert_eq!((s.stride, s.decoder, s.ramp, s.method), (1, DecoderKind::Taesd, 4, Method::Slerp));
        assert_eq!(s.infill, MuseTalkInfill::Latent);
        assert_eq!(s.fps, FrameRate::whole(25));
    }

    #[test]
    fn bad_values_are_refused_with_the_field_named() {
        for (k, v) in
            [("stride", "0"), ("stride", "-1"), ("decoder", "vqgan"), ("ramp", "999"), ("fps", "0"), ("vad", "webrtc")]
        {
            let e = raw(&[(k, v)]).settings().unwrap_err();
            assert_eq!(e.status.as_u16(), 422);
            assert!(e.message.starts_with(k), "{e}");
        }
        assert_eq!(raw(&[("decoder", "sd-vae")]).settings().unwrap().decoder, DecoderKind::SdVae);
        assert_eq!(raw(&[("decoder", "full_vae")]).settings().unwrap().decoder, DecoderKind::SdVae);
        assert_eq!(raw(&[("vad", "Energy")]).settings().unwrap().vad, Some(VadKind::Energy));
        assert_eq!(raw(&[]).settings().unwrap().vad, None, "absent: the server's --vad");
        let mut r = RawOptions::default();
        assert_eq!(r.set("strid", "1".into()).unwrap_err().code, "unknown_field");
        r.set("stride", "2".into()).unwrap();
        assert_eq!(r.set("stride", "2".into()).unwrap_err().code, "duplicate_field");
    }

    #[test]
    fn infill_is_latent_or_image() {
        assert_eq!(raw(&[("infill", "image")]).settings().unwrap().infill, MuseTalkInfill::Image);
        assert_eq!(raw(&[("infill", " Latent ")]).settings().unwrap().infill, MuseTalkInfill::Latent);
        let e = raw(&[("infill", "pixels")]).settings().unwrap_err();
        assert_eq!((e.status.as_u16(), e.code), (422, "invalid_option"));
        assert_eq!(e.message, "infill: 'pixels': expected latent or image");
    }
}
