//! Server-sent events: framing for writers and an incremental parser for readers.
//!
//! The parser accepts bytes in arbitrary pieces (a network read may split a line or a
//! UTF-8 character anywhere) and yields complete events.

/// One SSE event: its `event:` name (if any) and its joined `data:` lines.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Event {
    pub event: Option<String>,
    pub data: String,
}

/// Frames `data` as one SSE event.
pub fn frame(data: &str) -> String {
    let mut out = String::with_capacity(data.len() + 8);
    for line in data.split('\n') {
        out.push_str("data: ");
        out.push_str(line);
        out.push('\n');
    }
    out.push('\n');
    out
}

/// The terminal event of an OpenAI stream.
pub const DONE: &str = "[DONE]";

/// Incremental SSE parser.
#[derive(Debug, Default)]
pub struct Parser {
    buf: Vec<u8>,
    event: Option<String>,
    data: Vec<String>,
    /// Upper bound on one buffered line, so a peer cannot grow memory without end.
    max_line: usize,
}

/// A stream that broke the SSE rules.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum SseError {
    #[error("SSE line longer than {0} bytes")]
    LineTooLong(usize),
    #[error("SSE line is not UTF-8")]
    NotUtf8,
}

impl Parser {
    /// A parser that refuses lines longer than `max_line` bytes.
    pub fn new(max_line: usize) -> Self {
        Self {
            max_line,
            ..Default::default()
        }
    }

    /// Feeds bytes; returns the events completed by them.
    pub fn push(&mut self, bytes: &[u8]) -> Result<Vec<Event>, SseError> {
        let mut events = Vec::new();
        self.buf.extend_from_slice(bytes);
        let mut start = 0;
        while let Some(pos) = self.buf[start..].iter().position(|&b| b == b'\n') {
            let end = start + pos;
            let mut line = &self.buf[start..end];
            if line.last() == Some(&b'\r') {
                line = &line[..line.len() - 1];
            }
            let line = std::str::from_utf8(line)
                .map_err(|_| SseError::NotUtf8)?
                .to_string();
            start = end + 1;
            if let Some(ev) = self.line(&line) {
                events.push(ev);
            }
        }
        self.buf.drain(..start);
        let limit = if self.max_line == 0 {
            1 << 20
        } else {
            self.max_line
        };
        if self.buf.len() > limit {
            return Err(SseError::LineTooLong(limit));
        }
        Ok(events)
    }

    fn line(&mut self, line: &str) -> Option<Event> {
        if line.is_empty() {
            if self.data.is_empty() {
                self.event = None;
                return None;
            }
            return Some(Event {
                event: self.event.take(),
                data: std::mem::take(&mut self.data).join("\n"),
            });
        }
        if line.starts_with(':') {
            return None;
        }
        let (field, value) = match line.split_once(':') {
            Some((f, v)) => (f, v.strip_prefix(' ').unwrap_or(v)),
            None => (line, ""),
        };
        match field {
            "data" => self.data.push(value.to_string()),
            "event" => self.event = Some(value.to_string()),
            _ => {}
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_survive_any_split_point() {
        let stream = format!(
            "{}: keep-alive\n\n{}{}",
            "",
            frame("{\"a\":\"é\"}"),
            frame(DONE)
        );
        let bytes = stream.as_bytes();
        for cut in 0..bytes.len() {
            let mut p = Parser::new(1024);
            let mut got = p.push(&bytes[..cut]).expect("first half");
            got.extend(p.push(&bytes[cut..]).expect("second half"));
            let data: Vec<_> = got.into_iter().map(|e| e.data).collect();
            assert_eq!(
                data,
                vec!["{\"a\":\"é\"}".to_string(), DONE.to_string()],
                "cut at {cut}"
            );
        }
    }

    #[test]
    fn multi_line_data_and_crlf() {
        let mut p = Parser::new(1024);
        let evs = p
            .push(b"event: x\r\ndata: a\r\ndata: b\r\n\r\n")
            .expect("parse");
        assert_eq!(
            evs,
            vec![Event {
                event: Some("x".into()),
                data: "a\nb".into()
            }]
        );
        assert_eq!(frame("a\nb"), "data: a\ndata: b\n\n");
    }

    #[test]
    fn endless_line_is_refused() {
        let mut p = Parser::new(16);
        assert_eq!(p.push(&[b'x'; 17]), Err(SseError::LineTooLong(16)));
    }
}
