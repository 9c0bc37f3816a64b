//! Local-buffer (staging) space accounting.
/// A staging reservation, released on drop.
pub struct Reservation {}
