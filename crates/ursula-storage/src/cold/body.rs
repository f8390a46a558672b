//! [`Body`]: the bytes of an object to create, in pieces that are sent as they are.

use bytes::Bytes;

/// The contents of an object, as a list of pieces that are never concatenated: a flush can
/// send the hot ring's chunks, or a frame's header and footer around a body, without copying.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Body(Vec<Bytes>);

impl Body {
    pub fn new() -> Self {
        Body::default()
    }

    /// Appends a piece (an empty one is dropped).
    pub fn push(&mut self, piece: Bytes) {
        if !piece.is_empty() {
            self.0.push(piece);
        }
    }

    /// Total length in bytes.
    pub fn len(&self) -> u64 {
        self.0.iter().map(|p| p.len() as u64).sum()
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    pub fn pieces(&self) -> &[Bytes] {
        &self.0
    }

    pub fn into_pieces(self) -> Vec<Bytes> {
        self.0
    }

    /// The whole body in one buffer (copies unless there is at most one piece).
    pub fn to_bytes(&self) -> Bytes {
        match self.0.as_slice() {
            [] => Bytes::new(),
            [one] => one.clone(),
            many => {
                let mut v = Vec::with_capacity(self.len() as usize);
                for p in many {
                    v.extend_from_slice(p);
                }
                Bytes::from(v)
            }
        }
    }
}

impl From<Bytes> for Body {
    fn from(b: Bytes) -> Self {
        let mut body = Body::new();
        body.push(b);
        body
    }
}

impl From<Vec<u8>> for Body {
    fn from(v: Vec<u8>) -> Self {
        Body::from(Bytes::from(v))
    }
}

impl From<&'static [u8]> for Body {
    fn from(s: &'static [u8]) -> Self {
        Body::from(Bytes::from_static(s))
    }
}

impl FromIterator<Bytes> for Body {
    fn from_iter<I: IntoIterator<Item = Bytes>>(iter: I) -> Self {
        let mut body = Body::new();
        for p in iter {
            body.push(p);
        }
        body
    }
}
