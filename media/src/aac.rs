//! AAC-LC encoding of the audio track with the `fdk-aac` crate (Fraunhofer FDK AAC, whose C++
//! source `fdk-aac-sys` bundles and builds with `cc`: no system library needed), and decoding
//! of raw AAC access units for reading MP4s back ([`Decoder`]).

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

/// FDK AAC's decoder for raw access units (the MP4 sample format), with its PCM limiter off.
///
/// Written against `fdk-aac-sys` because the `fdk-aac` crate's decoder cannot set parameters:
/// by default FDK's PCM limiter and its energy-interpolation concealment each delay the output
/// (`outputDelay` reads 1264 samples at 16 kHz), which would shift the audio against the MP4's
/// edit list and hold back the tail. With the limiter off and noise-substitution concealment the
/// output has no delay beyond the codec's own, which the edit list accounts for.
pub struct Decoder {
    handle: fdk_aac_sys::HANDLE_AACDECODER,
    pcm: Vec<i16>,
}

fn dec_err(what: &str, code: fdk_aac_sys::AAC_DECODER_ERROR) -> MediaError {
    MediaError::Encode { encoder: "fdk-aac decoder".into(), detail: format!("{what} failed (error 0x{code:x})") }
}

impl Decoder {
    /// A decoder for the stream described by `asc` (its AudioSpecificConfig).
    pub fn new(asc: &[u8]) -> Result<Self> {
        // SAFETY: plain C API calls on a handle this struct owns; the config pointer and length
        // describe `asc`, which outlives the call.
        unsafe {
            let handle = fdk_aac_sys::aacDecoder_Open(fdk_aac_sys::TRANSPORT_TYPE_TT_MP4_RAW, 1);
            if handle.is_null() {
                return Err(dec_err("opening the decoder", 0));
            }
            let d = Self { handle, pcm: vec![0; 2048 * 8] };
            let mut ptr = asc.as_ptr() as *mut u8;
            let len = asc.len() as u32;
            let e = fdk_aac_sys::aacDecoder_ConfigRaw(d.handle, &mut ptr, &len);
            if e != 0 {
                return Err(dec_err("reading the AudioSpecificConfig", e));
            }
            for (param, value, what) in [
                (fdk_aac_sys::AACDEC_PARAM_AAC_PCM_LIMITER_ENABLE, 0, "switching the limiter off"),
                (fdk_aac_sys::AACDEC_PARAM_AAC_CONCEAL_METHOD, 1, "choosing concealment without delay"),
            ] {
                let e = fdk_aac_sys::aacDecoder_SetParam(d.handle, param, value);
                if e != 0 {
                    return Err(dec_err(what, e));
                }
            }
            Ok(d)
        }
    }

    /// Decodes one access unit; returns its interleaved samples.
    pub fn decode(&mut self, au: &[u8]) -> Result<&[i16]> {
        // SAFETY: the buffers passed are valid for the lengths given; the decoder copies the
        // input during Fill and writes at most `pcm.len()` samples.
        unsafe {
            let mut ptr = au.as_ptr() as *mut u8;
            let len = au.len() as u32;
            let mut left = len;
            let e = fdk_aac_sys::aacDecoder_Fill(self.handle, &mut ptr, &len, &mut left);
            if e != 0 {
                return Err(dec_err("filling the decoder", e));
            }
            if left != 0 {
                return Err(dec_err(&format!("taking the access unit ({left} of {len} bytes left)"), 0));
            }
            let e = fdk_aac_sys::aacDecoder_DecodeFrame(self.handle, self.pcm.as_mut_ptr(), self.pcm.len() as i32, 0);
            if e != 0 {
                return Err(dec_err("decoding an access unit", e));
            }
            let info = &*fdk_aac_sys::aacDecoder_GetStreamInfo(self.handle);
            let n = (info.frameSize.max(0) as usize * info.numChannels.max(0) as usize).min(self.pcm.len());
            Ok(&self.pcm[..n])
        }
    }

    /// Samples per channel by which the decoder delays its output beyond the codec's own delay.
    pub fn output_delay(&self) -> u32 {
        // SAFETY: as in `format`.
        unsafe { (*fdk_aac_sys::aacDecoder_GetStreamInfo(self.handle)).outputDelay }
    }

    /// Sample rate and channel count of the decoded stream (known after the first frame).
    pub fn format(&self) -> (u32, u16) {
        // SAFETY: the handle is open; the stream info lives as long as the handle.
        let info = unsafe { &*fdk_aac_sys::aacDecoder_GetStreamInfo(self.handle) };
        (info.sampleRate.max(0) as u32, info.numChannels.max(0) as u16)
    }
}

impl Drop for Decoder {
    fn drop(&mut self) {
        // SAFETY: the handle was opened by `new` and is closed once.
        unsafe { fdk_aac_sys::aacDecoder_Close(self.handle) }
    }
}
