//! AAC-LC encoding of the audio track with the `fdk-aac` crate (Fraunhofer FDK AAC, whose C++
//! source `fdk-aac-sys` bundles and builds with `cc`: no system library needed).

use fdk_aac::enc::{AudioObjectType, BitRate, ChannelMode, Encoder, EncoderParams, Transport};

use crate::audio::{AudioTrack, AAC_RATES};
use crate::error::{MediaError, Result};

/// An encoded AAC-LC stream: raw access units (no ADTS headers) plus what the `esds` needs.
#[derive(Debug, Clone)]
pub struct EncodedAac {
    pub sample_rate: u32,
    pub channels: u16,
    /// Index of `sample_rate` in the AAC sampling-frequency table.
    pub freq_index: u8,
    /// AudioSpecificConfig from the encoder.
    pub asc: Vec<u8>,
    /// Access units, each `frame_len` samples per channel.
    pub access_units: Vec<Vec<u8>>,
    pub frame_len: u32,
    /// Encoder delay (priming samples) at the start of the stream; an edit list skips it.
    pub delay: u32,
    /// Sample frames of real audio (without priming and padding).
    pub frames: u64,
    pub bitrate: u32,
}

fn err(detail: impl Into<String>) -> MediaError {
    MediaError::Encode { encoder: "fdk-aac".into(), detail: detail.into() }
}

/// Encodes the track to AAC-LC at a constant bit rate (32 kb/s per channel at 16 kHz,
/// 64 kb/s per channel at 44.1/48 kHz).
pub fn encode(track: &AudioTrack) -> Result<EncodedAac> {
    let freq_index = AAC_RATES
        .iter()
        .position(|&r| r == track.sample_rate)
        .ok_or_else(|| err(format!("{} Hz is not an AAC sample rate", track.sample_rate)))? as u8;
    let channels = match track.channels {
        1 => ChannelMode::Mono,
        2 => ChannelMode::Stereo,
        n => return Err(err(format!("{n} channels (1 or 2 supported)"))),
    };
    let per_channel = match track.sample_rate {
        r if r >= 44_100 => 64_000,
        r if r >= 32_000 => 48_000,
        r if r >= 16_000 => 32_000,
        _ => 16_000,
    };
    let bitrate = per_channel * track.channels as u32;
    let enc = Encoder::new(EncoderParams {
        bit_rate: BitRate::Cbr(bitrate),
        sample_rate: track.sample_rate,
        transport: Transport::Raw,
        channels,
        audio_object_type: AudioObjectType::Mpeg4LowComplexity,
    })
    .map_err(|e| err(e.to_string()))?;
    let info = enc.info().map_err(|e| err(e.to_string()))?;
    let frame_len = info.frameLength as usize;
    let delay = info.nDelay as usize;
    let asc = info.confBuf[..info.confSize as usize].to_vec();
    if frame_len == 0 || asc.len() < 2 {
        return Err(err("encoder reported no frame length or AudioSpecificConfig"));
    }
    let ch = track.channels as usize;
    let frames = track.frames();
    // fdk-aac's Rust wrapper cannot signal end of stream (numInSamples = -1), so the tail
    // is flushed by feeding silence until every real sample has come out.
    let needed = (frames + delay).div_ceil(frame_len);
    let block = frame_len * ch;
    let zeros = vec![0i16; block];
    let mut out = vec![0u8; 8192];
    let mut aus = Vec::with_capacity(needed);
    let mut pos = 0usize;
    let mut calls = 0usize;
    while aus.len() < needed {
        calls += 1;
        if calls > 4 * needed + 64 {
            return Err(err("encoder stopped producing output"));
        }
        let input: &[i16] = if pos < track.samples.len() {
            &track.samples[pos..(pos + block).min(track.samples.len())]
        } else {
            &zeros
        };
        let r = enc.encode(input, &mut out).map_err(|e| err(e.to_string()))?;
        if pos < track.samples.len() {
            pos += r.input_consumed;
        }
        if r.output_size > 0 {
            aus.push(out[..r.output_size].to_vec());
        }
    }
    Ok(EncodedAac {
        sample_rate: track.sample_rate,
        channels: track.channels,
        freq_index,
        asc,
        access_units: aus,
        frame_len: frame_len as u32,
        delay: delay as u32,
        frames: frames as u64,
        bitrate,
    })
}
