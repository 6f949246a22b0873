//! Prepared avatars, in memory, least recently used evicted first. An avatar's id is derived from
//! its content (SHA-256 of the file's bytes and the face boxes), so registering the same file
//! twice gives the same id and prepares nothing the second time. Preparations are kept per
//! decoder, since the latents depend on the image encoder.

use cadence::musetalk::render::PreparedAvatar;
use cadence::musetalk::DecoderKind;
use cadence_media::{FaceBox, RgbImage};
use sha2::{Digest, Sha256};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};

/// What an avatar was made from, kept to prepare it for another decoder.
pub enum AvatarMedia {
    Image {
        image: RgbImage,
        face: FaceBox,
        /// The detector's landmarks when it found the face (the blend mask follows them).
        landmarks: Option<[[f32; 2]; 5]>,
    },
    /// A video avatar: the MP4's bytes (checked when registered; written out again to prepare
    /// it for another decoder, since its frames are decoded one at a time from a file), its
    /// frame size and one face box per frame.
    Video {
        mp4: Vec<u8>,
        width: u32,
        height: u32,
        faces: Vec<FaceBox>,
        /// The detector's faces per frame when it found them.
        found: Option<cadence::avatar::faces::FoundFaces>,
    },
}

impl AvatarMedia {
    pub fn size(&self) -> (u32, u32) {
        match self {
            AvatarMedia::Image { image, .. } => image.dimensions(),
            AvatarMedia::Video { width, height, .. } => (*width, *height),
        }
    }

    /// One face box per avatar frame.
    pub fn faces(&self) -> &[FaceBox] {
        match self {
            AvatarMedia::Image { face, .. } => std::slice::from_ref(face),
            AvatarMedia::Video { faces, .. } => faces,
        }
    }
}

pub struct AvatarEntry {
    pub id: String,
    pub media: AvatarMedia,
    /// Size of the file the avatar was made from.
    pub file_bytes: usize,
    /// Where the face boxes came from ([`cadence::avatar::faces::report`]).
    pub face: serde_json::Value,
    prepared: Mutex<Vec<(DecoderKind, Arc<PreparedAvatar>)>>,
}

impl AvatarEntry {
    pub fn new(id: String, media: AvatarMedia, file_bytes: usize, face: serde_json::Value) -> Self {
        Self { id, media, file_bytes, face, prepared: Mutex::new(Vec::new()) }
    }

    pub fn prepared(&self, decoder: DecoderKind) -> Option<Arc<PreparedAvatar>> {
        self.prepared.lock().unwrap().iter().find(|(d, _)| *d == decoder).map(|(_, p)| p.clone())
    }

    pub fn set_prepared(&self, decoder: DecoderKind, p: Arc<PreparedAvatar>) {
        let mut v = self.prepared.lock().unwrap();
        v.retain(|(d, _)| *d != decoder);
        v.push((decoder, p));
    }

    /// Decoders this avatar is prepared for.
    pub fn decoders(&self) -> Vec<DecoderKind> {
        self.prepared.lock().unwrap().iter().map(|(d, _)| *d).collect()
    }

    pub fn describe(&self) -> serde_json::Value {
        let (width, height) = self.media.size();
        let faces = self.media.faces();
        let f = faces[0];
        let mut v = serde_json::json!({
            "avatar_id": self.id,
            "kind": match self.media { AvatarMedia::Image { .. } => "image", AvatarMedia::Video { .. } => "video" },
            "width": width,
            "height": height,
            "frames": faces.len(),
            "face_box": [f.x, f.y, f.w, f.h],
            "decoders": self.decoders().iter().map(|d| decoder_name(*d)).collect::<Vec<_>>(),
            "file_bytes": self.file_bytes,
            "face": self.face,
        });
        // Boxes that differ between frames (`face_boxes`) are listed; one box is `face_box`.
        if faces.iter().any(|b| *b != f) {
            v["face_boxes"] = faces.iter().map(|b| vec![b.x, b.y, b.w, b.h]).collect::<Vec<_>>().into();
        }
        v
    }
}

/// The name a decoder has in the HTTP API (the source's `taesd` and `full_vae`).
pub fn decoder_name(d: DecoderKind) -> &'static str {
    match d {
        DecoderKind::Taesd => "taesd",
        DecoderKind::SdVae => "full_vae",
    }
}

/// SHA-256 (hex) of the avatar file's bytes and its face boxes (one per frame; an image's
/// single box hashes as it always did, so image ids are unchanged by video avatars).
pub fn avatar_id(bytes: &[u8], faces: &[FaceBox]) -> String {
    let mut h = Sha256::new();
    h.update(bytes);
    for face in faces {
        h.update(format!("\nface_box={},{},{},{}", face.x, face.y, face.w, face.h).as_bytes());
    }
    h.finalize().iter().map(|b| format!("{b:02x}")).collect()
}

/// Whether `id` has the form of an avatar id (64 lowercase hex digits); anything else is refused
/// before a lookup.
pub fn valid_id(id: &str) -> bool {
    id.len() == 64 && id.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

pub struct AvatarCache {
    capacity: usize,
    tick: u64,
    entries: HashMap<String, (Arc<AvatarEntry>, u64)>,
}

impl AvatarCache {
    pub fn new(capacity: usize) -> Self {
        Self { capacity: capacity.max(1), tick: 0, entries: HashMap::new() }
    }

    pub fn get(&mut self, id: &str) -> Option<Arc<AvatarEntry>> {
        self.tick += 1;
        let tick = self.tick;
        self.entries.get_mut(id).map(|(e, used)| {
            *used = tick;
            e.clone()
        })
    }

    /// Inserts `entry` unless its id is present (then its preparations join the cached entry's);
    /// returns the cached entry either way, evicting the least recently used one when full.
    pub fn insert_arc(&mut self, entry: Arc<AvatarEntry>) -> Arc<AvatarEntry> {
        if let Some(e) = self.get(&entry.id) {
            if !Arc::ptr_eq(&e, &entry) {
                for d in entry.decoders() {
                    e.set_prepared(d, entry.prepared(d).expect("listed by decoders()"));
                }
            }
            return e;
        }
        while self.entries.len() >= self.capacity {
            let oldest = self.entries.iter().min_by_key(|(_, (_, used))| *used).map(|(k, _)| k.clone());
            match oldest {
                Some(k) => {
                    tracing::info!(avatar_id = %k, "evicting the least recently used avatar");
                    self.entries.remove(&k);
                }
                None => break,
            }
        }
        self.tick += 1;
        self.entries.insert(entry.id.clone(), (entry.clone(), self.tick));
        entry
    }

    pub fn remove(&mut self, id: &str) -> bool {
        self.entries.remove(id).is_some()
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(n: u8) -> Arc<AvatarEntry> {
        let face = FaceBox { x: 0, y: 0, w: 16, h: 16 };
        let media = AvatarMedia::Image { image: RgbImage::new(64, 64), face, landmarks: None };
        Arc::new(AvatarEntry::new(avatar_id(&[n], &[face]), media, 1, serde_json::Value::Null))
    }

    #[test]
    fn ids_depend_on_bytes_and_face_box() {
        let f = FaceBox { x: 0, y: 0, w: 16, h: 16 };
        let id = avatar_id(b"png", &[f]);
        assert!(valid_id(&id));
        assert_eq!(id, avatar_id(b"png", &[f]));
        assert_ne!(id, avatar_id(b"png", &[FaceBox { x: 2, ..f }]));
        assert_ne!(id, avatar_id(b"jpg", &[f]));
        // A video's boxes, frame by frame: their order and number count.
        let g = FaceBox { x: 2, ..f };
        assert_ne!(avatar_id(b"mp4", &[f, g]), avatar_id(b"mp4", &[g, f]));
        assert_ne!(avatar_id(b"mp4", &[f, f]), avatar_id(b"mp4", &[f]));
        for bad in ["", "../etc/passwd", &id.to_uppercase(), &id[..63], &format!("{id}0")] {
            assert!(!valid_id(bad), "{bad}");
        }
    }

    #[test]
    fn least_recently_used_is_evicted() {
        let mut c = AvatarCache::new(2);
        let (a, b, d) = (entry(1), entry(2), entry(3));
        let (ida, idb) = (a.id.clone(), b.id.clone());
        c.insert_arc(a);
        c.insert_arc(b);
        assert!(c.get(&ida).is_some());
        c.insert_arc(d);
        assert_eq!(c.len(), 2);
        assert!(c.get(&ida).is_some() && c.get(&idb).is_none());
        assert!(c.remove(&ida) && !c.remove(&ida));
    }
}
