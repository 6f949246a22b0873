//! # cadence-media: media I/O for `cadence render` and the experiments
//!
//! Everything here builds from crates.io alone (no system library): the default H.264
//! encoder is OpenH264 and the AAC encoder FDK AAC, both compiled from source bundled in
//! their crates; the MP4 is laid out in Rust with `mp4-atom` box types. The optional `ffmpeg`
//! feature adds libx264 and NVENC through the system's libav* (see `README.md`).
//!
//! ## Audio ([`audio`])
//! - [`load_wav`]`(path) -> Result<Audio>`: WAV of any rate and channel count, 8/16/24/32-bit
//!   integer or 32-bit float; [`Audio::samples_16k`] is mono 16 kHz f32; [`Audio::track`] is
//!   what the MP4's AAC track is encoded from.
//! - [`wav_duration`]`(path) -> Result<f64>`: duration from the header only, to reject a too
//!   long file before decoding it.
//! - [`audio::resample`], [`audio::resampled_len`]: rubato FFT resampling with its delay
//!   removed, output length `round(n * to / from)`.
//! - Errors: not a WAV ([`MediaError::NotWav`]), truncated ([`MediaError::TruncatedWav`]),
//!   zero samples ([`MediaError::EmptyAudio`]).
//!
//! ## Voice activity ([`vad`])
//! - [`voice_activity`]`(samples_16k, fps, n_frames) -> Vec<bool>`: one decision per video
//!   frame, energy based, thresholds relative to the clip's loudness, 200 ms hangover
//!   (documented in [`vad`] and [`VadConfig`]); [`voice_activity_with`] takes a config.
//! - [`frame_count`]`(duration_s, fps) = ceil(duration_s * fps)`.
//! - Silero VAD v5 ([`vad::silero`]), a trained detector with the weights of the committed
//!   ONNX file, run by cadence's own network: [`silero_voice_activity`]`(samples_16k, fps, n_frames) -> Vec<bool>` (the same shape
//!   as [`voice_activity`]), [`vad::silero::try_voice_activity_with`] with a [`SileroConfig`];
//!   [`SileroVad::process_chunk`] for a stream of 512-sample chunks, [`VadIterator`] for live
//!   start/end events; [`vad::silero::speech_probabilities`] and
//!   [`vad::silero::speech_timestamps`] for a whole clip (Silero's `get_speech_timestamps`).
//!   By default the samples first go through cadence's front end ([`vad::denoise`]: Wiener
//!   noise suppression and AGC; [`SileroConfig::denoise`] switches it off).
//!
//! ## Avatar image ([`image`])
//! - [`load_image`]`(path) -> Result<RgbImage>`: PNG/JPEG, each side at least 64 and a size the
//!   encoder takes ([`check_frame_size`]: at most 3840x2160 or 2160x3840).
//! - [`FaceBox`] `{x, y, w, h}`: [`FaceBox::centered`], [`FaceBox::validate`].
//! - [`crop_to_planar`]`(img, face, 256) -> Result<Vec<f32>>`: CHW f32 in [0, 1] for the
//!   image encoder; [`paste_region`]`(decoded, 256, face, frame_w, frame_h) ->
//!   Result<PasteRegion>`: the decoded crop resized (bilinear) to the face box, with its
//!   position, for compositing.
//!
//! ## Video ([`video`])
//! - [`VideoWriter::create`]`(path, width, height, fps, EncoderKind, Option<&Audio>)`,
//!   [`VideoWriter::push_nv12`]`(&[u8])`, [`VideoWriter::finish`]`() -> Result<VideoStats>`.
//! - [`EncoderKind`]: `OpenH264` (default, always built), `X264` and `Nvenc` (feature
//!   `ffmpeg`; without it they fail with a message saying so).
//! - Progressive MP4 (`moov` at the end) is the default for files. For a live stream,
//!   [`FragmentedWriter::new`]`(W: Write, name, width, height, fps, EncoderKind,
//!   Option<AudioFormat>)` writes a fragmented MP4 (init segment, then one `moof`+`mdat` per
//!   GOP of [`idr_period`] frames) with [`push_nv12`](FragmentedWriter::push_nv12),
//!   [`push_audio`](FragmentedWriter::push_audio) (16-bit PCM in pieces) and
//!   [`codecs`](FragmentedWriter::codecs) for a Media Source Extensions MIME type;
//!   [`SegmentQueue`] collects its segments for a server (see [`fmp4`]).
//!
//! ## Probe ([`probe()`])
//! - [`probe()`]`(path) -> Result<Mp4Info>`: codec, size, fps, frame count, audio presence and
//!   codec, read from the MP4 boxes in Rust.
//!
//! ## Reading MP4 back ([`demux`])
//! - [`Mp4Reader::open`]`(path)`, [`Mp4Reader::decode_video`]`() -> Result<DecodedVideo>` (every
//!   H.264 frame as NV12, decoded by OpenH264), [`Mp4Reader::for_each_video_frame`] (one frame in
//!   memory at a time), [`Mp4Reader::decode_audio`]`() -> Result<Option<DecodedAudio>>` (AAC by
//!   FDK AAC, edit list applied). The sample tables are checked against the file before use.
//!
//! ## Avatar videos ([`avatar_video`])
//! - [`avatar_video_info`]`(path) -> Result<AvatarVideoInfo>`: the container checked before any
//!   decoding (a video track in H.264 that OpenH264 decodes: 8-bit 4:2:0, no B-frames; even
//!   sides of at least 64 in a size the encoder takes; a constant frame rate: a variable rate is
//!   refused with the rates found), with the frame count.
//! - [`for_each_avatar_frame`]`(path, &info, f)`: every frame decoded and converted to RGB
//!   (BT.709 limited range), one frame in memory at a time.

pub mod aac;
pub mod audio;
pub mod avatar_video;
pub mod demux;
pub mod error;
#[cfg(feature = "ffmpeg")]
mod ffmpeg_enc;
pub mod fmp4;
mod fmux;
pub mod image;
mod mux;
pub mod probe;
pub mod vad;
pub mod video;
pub mod wav;

pub use audio::{
    load_wav, open_wav_stream, wav_duration, Audio, AudioDecoder, AudioFormat, AudioStream, AudioTrack,
    StreamResampler, TARGET_RATE,
};
pub use avatar_video::{avatar_video_info, for_each_avatar_frame, AvatarVideoInfo};
pub use demux::{DecodedAudio, DecodedVideo, Mp4Reader};
pub use error::{MediaError, Result};
pub use fmp4::{FragmentedWriter, SegmentQueue};
pub use image::{crop_to_planar, image_size, load_image, paste_region, planar_to_rgb, FaceBox, PasteRegion, RgbImage};
pub use probe::{probe, Mp4Info};
pub use vad::silero::{
    voice_activity as silero_voice_activity, ChunkProbabilities, SileroConfig, SileroVad, SpeechEvent, SpeechSegment,
    VadIterator,
};
pub use vad::{
    frame_count, frames_from_hops, hop_activity_above, hop_context, voice_activity, voice_activity_from_levels,
    voice_activity_with, HopLevels, LevelReference, VadConfig,
};
pub use video::{
    check_frame_size, idr_period, EncoderKind, FrameRate, VideoStats, VideoWriter, MAX_FRAME_SHORT_SIDE, MAX_FRAME_SIDE,
};
