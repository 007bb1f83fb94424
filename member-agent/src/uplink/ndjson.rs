//! Framing of the work stream: newline-delimited JSON, one [`WorkEvent`] per line, read from a
//! long-lived response body in chunks that cut lines anywhere.
//!
//! Hand-written rather than `tokio_util::codec::LinesCodec` because the stream needs two things
//! that codec does not give: bytes after the last newline when the body ends are a line cut off
//! by a broken connection (dropped, never parsed), and a line over the limit is an error that
//! ends the connection rather than text silently skipped.

use bytes::{Buf, BytesMut};
use lifeboat_api::protocol::WorkEvent;

/// The longest line accepted: a work item carries one manifest, far below this.
pub const MAX_LINE_BYTES: usize = 16 * 1024 * 1024;

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum FrameError {
    #[error("a work stream line exceeds {limit} bytes")]
    LineTooLong { limit: usize },
    #[error("work stream line {line}: {reason}")]
    Malformed { line: u64, reason: String },
}

/// Splits chunks into lines and parses each as a [`WorkEvent`].
#[derive(Debug)]
pub struct LineFramer {
    buffer: BytesMut,
    limit: usize,
    /// Lines parsed so far (for error messages).
    lines: u64,
    /// How far `buffer` was already searched for a newline.
    scanned: usize,
}

impl LineFramer {
    pub fn new(limit: usize) -> Self {
        Self {
            buffer: BytesMut::new(),
            limit,
            lines: 0,
            scanned: 0,
        }
    }

    /// Adds a chunk; returns the events of every line it completed. Empty lines are skipped; a
    /// `\r` before the newline is tolerated.
    pub fn push(&mut self, chunk: &[u8]) -> Result<Vec<WorkEvent>, FrameError> {
        self.buffer.extend_from_slice(chunk);
        let mut events = Vec::new();
        loop {
            let Some(offset) = self.buffer[self.scanned..].iter().position(|b| *b == b'\n') else {
                self.scanned = self.buffer.len();
                if self.buffer.len() > self.limit {
                    return Err(FrameError::LineTooLong { limit: self.limit });
                }
                return Ok(events);
            };
            let end = self.scanned + offset;
            if end > self.limit {
                return Err(FrameError::LineTooLong { limit: self.limit });
            }
            let line = self.buffer.split_to(end);
            self.buffer.advance(1);
            self.scanned = 0;
            self.lines += 1;
            let line = line.strip_suffix(b"\r").unwrap_or(&line);
            if line.iter().all(u8::is_ascii_whitespace) {
                continue;
            }
            let event =
                serde_json::from_slice::<WorkEvent>(line).map_err(|e| FrameError::Malformed {
                    line: self.lines,
                    reason: e.to_string(),
                })?;
            events.push(event);
        }
    }

    /// Bytes of an unfinished line (what a connection cut mid-line leaves; never parsed).
    pub fn pending(&self) -> usize {
        self.buffer.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use lifeboat_api::protocol::WorkKey;

    fn delete(name: &str, revision: i64) -> WorkEvent {
        WorkEvent::Delete {
            key: WorkKey {
                namespace: "ml".into(),
                name: name.into(),
            },
            revision,
            binding_uid: String::new(),
            confirm_gone: false,
        }
    }

    fn line(event: &WorkEvent) -> String {
        format!("{}\n", serde_json::to_string(event).expect("serializable"))
    }

    #[test]
    fn lines_cut_anywhere_are_joined() {
        let text = format!(
            "{}{}{}",
            line(&delete("a", 1)),
            line(&WorkEvent::Bookmark),
            line(&delete("b", 2))
        );
        let bytes = text.as_bytes();
        // Every split point, including inside a multi-byte boundary-free JSON token.
        for cut in 0..bytes.len() {
            let mut framer = LineFramer::new(1024);
            let mut events = framer.push(&bytes[..cut]).expect("first half");
            events.extend(framer.push(&bytes[cut..]).expect("second half"));
            assert_eq!(
                events,
                vec![delete("a", 1), WorkEvent::Bookmark, delete("b", 2)]
            );
            assert_eq!(framer.pending(), 0);
        }
    }

    #[test]
    fn byte_by_byte_crlf_and_blank_lines() {
        let text = format!("\n\r\n{}", line(&delete("a", 1)).replace('\n', "\r\n"));
        let mut framer = LineFramer::new(1024);
        let mut events = Vec::new();
        for b in text.as_bytes() {
            events.extend(framer.push(&[*b]).expect("a byte"));
        }
        assert_eq!(events, vec![delete("a", 1)]);
    }

    #[test]
    fn an_unfinished_last_line_is_left_pending() {
        let mut framer = LineFramer::new(1024);
        let full = line(&delete("a", 1));
        let text = format!("{full}{}", &full[..10]);
        assert_eq!(
            framer.push(text.as_bytes()).expect("ok"),
            vec![delete("a", 1)]
        );
        assert_eq!(framer.pending(), 10);
    }

    #[test]
    fn a_line_over_the_limit_is_an_error_even_before_its_newline() {
        let mut framer = LineFramer::new(16);
        assert_eq!(framer.push(&[b'x'; 16]).expect("at the limit"), vec![]);
        assert_eq!(
            framer.push(b"x"),
            Err(FrameError::LineTooLong { limit: 16 })
        );
        let mut framer = LineFramer::new(16);
        let err = framer.push(format!("{}\n", "y".repeat(17)).as_bytes());
        assert_eq!(err, Err(FrameError::LineTooLong { limit: 16 }));
        // A line of exactly the limit, newline after, passes framing (and fails JSON here).
        let mut framer = LineFramer::new(16);
        let err = framer
            .push(format!("{}\n", "z".repeat(16)).as_bytes())
            .unwrap_err();
        assert!(
            matches!(err, FrameError::Malformed { line: 1, .. }),
            "{err}"
        );
    }

    #[test]
    fn a_malformed_line_names_its_number() {
        let mut framer = LineFramer::new(1024);
        let text = format!("{}{{\"type\":\"Nope\"}}\n", line(&WorkEvent::Bookmark));
        let err = framer.push(text.as_bytes()).unwrap_err();
        match err {
            FrameError::Malformed { line, reason } => {
                assert_eq!(line, 2);
                assert!(reason.contains("Nope"), "{reason}");
            }
            other => panic!("unexpected {other:?}"),
        }
    }
}
