//! A child's output cut into lines, read leniently and without ever stopping.
//!
//! tokio-util's `LinesCodec` ended the stream on a line longer than its bound, or one that is not UTF-8: the
//! error came once, and the `None` after it looked like end of file. The owner then stopped reading the pipe, so
//! one oversized answer left every later call waiting its timeout, and a child writing on found its pipe full and
//! hung, while the instance still showed online. Here neither is an error:
//! - a line that is not UTF-8 is read with U+FFFD for the bad bytes (a JSON parser then says what is wrong);
//! - a line over the bound is skipped as it streams past, in bounded memory, and reported as [`Line::TooLong`]
//!   with the top-level `id` it carried, so the call it answers fails at once with the reason instead of timing out.

use bytes::{Buf, BytesMut};
use tokio_util::codec::Decoder;

/// One line of a child's output.
#[derive(Debug, PartialEq, Eq)]
pub enum Line {
    Text(String),
    /// A line longer than the bound, skipped: how long it was, and what it was as far as a scan could tell.
    TooLong {
        bytes: usize,
        id: Option<i64>,
        has_method: bool,
    },
}

/// The longest a line grows in the read buffer before it is taken out of it, piece by piece ([`Gathered`]).
const SPILL_BYTES: usize = 64 * 1024;

/// Splits at `\n` (a `\r` before it is dropped), up to `max` bytes a line.
#[derive(Debug)]
pub struct Lines {
    max: usize,
    /// Where to go on looking for `\n` in the buffer: the bytes before it have none.
    searched: usize,
    /// The line being skipped, if the current one is too long.
    skipping: Option<Skipping>,
    /// Whether a skipped line is scanned for its id (stdout's are; stderr's need not be).
    scan: bool,
    /// A line longer than `spill` bytes so far: its start, out of the read buffer.
    gathered: Gathered,
    spill: usize,
}

#[derive(Debug)]
struct Skipping {
    bytes: usize,
    scan: IdScan,
}

/// The start of a long line, taken out of the read buffer as it comes and put together once, at its own size,
/// when its end comes. Left in the read buffer, a line of megabytes grew it by doubling (up to twice the line's
/// size, copied at each doubling) and it kept that size for the child's life: 16 MiB for every instance that
/// ever sent a 15 MB answer.
#[derive(Debug, Default)]
struct Gathered {
    pieces: Vec<Vec<u8>>,
    bytes: usize,
}

impl Gathered {
    fn take(&mut self, buf: &mut BytesMut) {
        self.bytes += buf.len();
        self.pieces.push(buf.to_vec());
        buf.clear();
    }

    /// The gathered bytes, then `tail`, in one allocation of their size.
    fn join(&mut self, tail: &[u8]) -> Vec<u8> {
        let mut line = Vec::with_capacity(self.bytes + tail.len());
        for piece in self.pieces.drain(..) {
            line.extend_from_slice(&piece);
        }
        line.extend_from_slice(tail);
        self.bytes = 0;
        line
    }
}

impl Lines {
    pub fn new(max: usize) -> Self {
        let spill = (max / 4).clamp(1, SPILL_BYTES);
        Lines { max, searched: 0, skipping: None, scan: true, gathered: Gathered::default(), spill }
    }

    /// Lines whose over-long ones are skipped without looking into them (stderr).
    pub(crate) fn unscanned(max: usize) -> Self {
        Lines { scan: false, ..Self::new(max) }
    }

    /// Skip the line being read, the gathered start included.
    fn start_skipping(&mut self) {
        let mut skipping = Skipping { bytes: self.gathered.bytes, scan: IdScan::default() };
        for piece in std::mem::take(&mut self.gathered).pieces {
            if self.scan {
                skipping.scan.feed(&piece);
            }
        }
        self.searched = 0;
        self.skipping = Some(skipping);
    }

    fn skip(&mut self, buf: &mut BytesMut) -> Option<Line> {
        let skipping = self.skipping.as_mut()?;
        let (chunk, end) = match memchr::memchr(b'\n', buf) {
            Some(at) => (at, Some(at + 1)),
            None => (buf.len(), None),
        };
        if self.scan {
            skipping.scan.feed(&buf[..chunk]);
        }
        skipping.bytes += chunk;
        buf.advance(end.unwrap_or(chunk));
        end?;
        let skipped = self.skipping.take()?;
        Some(Line::TooLong { bytes: skipped.bytes, id: skipped.scan.id, has_method: skipped.scan.has_method })
    }

    /// The line whose last bytes (before its `\n`) are `tail`: `tail` alone, or the gathered start and `tail`.
    fn finish(&mut self, tail: &[u8]) -> Line {
        if self.gathered.bytes == 0 {
            let content = tail.strip_suffix(b"\r").unwrap_or(tail);
            if content.len() > self.max {
                return self.too_long(content, tail.len());
            }
            return self.text(content);
        }
        let mut line = self.gathered.join(tail);
        let bytes = line.len();
        if line.last() == Some(&b'\r') {
            line.pop();
        }
        if line.len() > self.max {
            return self.too_long(&line, bytes);
        }
        self.text_owned(line)
    }

    /// One byte over, its end in the same read: reported as any line too long.
    fn too_long(&self, content: &[u8], bytes: usize) -> Line {
        let mut scan = IdScan::default();
        if self.scan {
            scan.feed(content);
        }
        Line::TooLong { bytes, id: scan.id, has_method: scan.has_method }
    }
}

impl Decoder for Lines {
    type Item = Line;
    type Error = std::io::Error;

    fn decode(&mut self, buf: &mut BytesMut) -> Result<Option<Line>, std::io::Error> {
        if self.skipping.is_some() {
            return Ok(self.skip(buf));
        }
        let gathered = self.gathered.bytes;
        // A line of `max` bytes may end in `\r\n`: its `\n` is looked for up to two bytes past the bound.
        let look_to = buf.len().min(self.max.saturating_add(2).saturating_sub(gathered));
        match memchr::memchr(b'\n', &buf[self.searched.min(look_to)..look_to]) {
            Some(offset) => {
                let at = self.searched + offset;
                self.searched = 0;
                let line = buf.split_to(at + 1);
                Ok(Some(self.finish(&line[..at])))
            }
            None if gathered + buf.len() > self.max.saturating_add(1) => {
                self.start_skipping();
                Ok(self.skip(buf))
            }
            None if buf.len() >= self.spill => {
                self.gathered.take(buf);
                self.searched = 0;
                Ok(None)
            }
            None => {
                self.searched = look_to;
                Ok(None)
            }
        }
    }

    fn decode_eof(&mut self, buf: &mut BytesMut) -> Result<Option<Line>, std::io::Error> {
        if let Some(line) = self.decode(buf)? {
            return Ok(Some(line));
        }
        // The last line, without its `\n`.
        if let Some(skipped) = self.skipping.take() {
            return Ok(Some(Line::TooLong {
                bytes: skipped.bytes,
                id: skipped.scan.id,
                has_method: skipped.scan.has_method,
            }));
        }
        if buf.is_empty() && self.gathered.bytes == 0 {
            return Ok(None);
        }
        self.searched = 0;
        let line = buf.split_to(buf.len());
        let line = self.gathered.join(&line);
        Ok(Some(self.text_owned(line)))
    }
}

impl Lines {
    /// A line within the bound as text. Bytes that are not UTF-8 become U+FFFD, three bytes each: a line that
    /// would grow past the bound that way is too long, as its text would be (before, a line of `max` bad bytes
    /// became `3 * max` bytes of text).
    fn text(&self, line: &[u8]) -> Line {
        let line = line.strip_suffix(b"\r").unwrap_or(line);
        match std::str::from_utf8(line) {
            Ok(text) => Line::Text(text.to_owned()),
            Err(_) => self.lossy(line),
        }
    }

    /// [`Lines::text`] of a line already in its own allocation, which becomes the text (no copy).
    fn text_owned(&self, mut line: Vec<u8>) -> Line {
        if line.last() == Some(&b'\r') {
            line.pop();
        }
        match String::from_utf8(line) {
            Ok(text) => Line::Text(text),
            Err(err) => self.lossy(err.as_bytes()),
        }
    }

    fn lossy(&self, line: &[u8]) -> Line {
        let grown: usize = line
            .utf8_chunks()
            .map(|chunk| chunk.valid().len() + if chunk.invalid().is_empty() { 0 } else { '\u{fffd}'.len_utf8() })
            .sum();
        if grown <= self.max {
            return Line::Text(String::from_utf8_lossy(line).into_owned());
        }
        if !self.scan {
            // A log line (stderr, in Latin-1 say) is kept, cut at the bound, rather than lost.
            let mut text = String::from_utf8_lossy(line).into_owned();
            let mut end = self.max;
            while !text.is_char_boundary(end) {
                end -= 1;
            }
            text.truncate(end);
            return Line::Text(text);
        }
        let mut scan = IdScan::default();
        scan.feed(line);
        // Its length as text, which is what is over the bound.
        Line::TooLong { bytes: grown, id: scan.id, has_method: scan.has_method }
    }
}

/// Finds a JSON object's top-level integer `id`, and whether it has a top-level `method`, in text fed piece by
/// piece, holding a few bytes at most. Nested members (a result's own `id`s) are not mistaken for them.
#[derive(Debug, Default)]
struct IdScan {
    depth: u32,
    in_string: bool,
    escaped: bool,
    /// A member name is expected next at depth 1 (after `{` or `,`).
    expect_key: bool,
    /// The member name being read is a key at depth 1; its first bytes.
    key: Option<Vec<u8>>,
    /// The last depth-1 key read, finished.
    last_key: Key,
    /// The digits of the `id` value being read.
    number: Option<Vec<u8>>,
    id: Option<i64>,
    has_method: bool,
}

#[derive(Debug, Default, PartialEq, Eq, Clone, Copy)]
enum Key {
    #[default]
    Other,
    Id,
}

impl IdScan {
    fn feed(&mut self, bytes: &[u8]) {
        for &byte in bytes {
            self.byte(byte);
        }
    }

    fn byte(&mut self, byte: u8) {
        if self.in_string {
            self.string_byte(byte);
            return;
        }
        if self.number_byte(byte) {
            return;
        }
        self.structure_byte(byte);
    }

    /// A byte inside a string: an escape, the string's end (a depth-1 key read whole), or a key's next byte.
    fn string_byte(&mut self, byte: u8) {
        if self.escaped {
            self.escaped = false;
        } else if byte == b'\\' {
            self.escaped = true;
        } else if byte == b'"' {
            self.in_string = false;
            if let Some(key) = self.key.take() {
                self.last_key = if key == b"id" { Key::Id } else { Key::Other };
                self.has_method |= key == b"method";
            }
        } else if let Some(key) = self.key.as_mut() {
            if key.len() < 8 {
                key.push(byte);
            }
        }
    }

    /// A byte of the `id` value being read, if one is: whether it was taken (a digit, or the whitespace before the
    /// first). Any other byte ends the value, read as the id when it ends where a number may.
    fn number_byte(&mut self, byte: u8) -> bool {
        let Some(number) = self.number.as_mut() else { return false };
        match byte {
            b'-' | b'0'..=b'9' if number.len() < 24 => {
                number.push(byte);
                true
            }
            b' ' | b'\t' | b'\r' | b'\n' if number.is_empty() => true,
            _ => {
                let digits = self.number.take().unwrap_or_default();
                if matches!(byte, b',' | b'}' | b' ' | b'\t' | b'\r' | b'\n') {
                    self.id = std::str::from_utf8(&digits).ok().and_then(|d| d.parse().ok());
                }
                false
            }
        }
    }

    /// A byte outside strings: nesting, where a depth-1 key is expected, and the start of the `id` value.
    fn structure_byte(&mut self, byte: u8) {
        match byte {
            b'"' => {
                self.in_string = true;
                if self.depth == 1 && self.expect_key {
                    self.expect_key = false;
                    self.key = Some(Vec::new());
                }
            }
            b'{' | b'[' => {
                self.depth += 1;
                self.expect_key = self.depth == 1 && byte == b'{';
            }
            b'}' | b']' => self.depth = self.depth.saturating_sub(1),
            b',' if self.depth == 1 => self.expect_key = true,
            b':' if self.depth == 1 && self.last_key == Key::Id => {
                self.last_key = Key::Other;
                self.number = Some(Vec::new());
            }
            _ => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn decode_all(codec: &mut Lines, input: &[u8], chunk: usize) -> Vec<Line> {
        let mut buf = BytesMut::new();
        let mut lines = Vec::new();
        for piece in input.chunks(chunk) {
            buf.extend_from_slice(piece);
            while let Some(line) = codec.decode(&mut buf).expect("decode") {
                lines.push(line);
            }
        }
        while let Some(line) = codec.decode_eof(&mut buf).expect("decode_eof") {
            lines.push(line);
        }
        lines
    }

    /// Lines of any size are cut the same way however the pipe delivers them; one over the bound is reported
    /// with its length and top-level id, and the lines after it are read as before (the stream goes on).
    #[test]
    fn a_line_too_long_is_reported_with_its_id_and_reading_goes_on() {
        let big = format!(
            r#"{{"result":{{"content":[{{"id":99,"text":"{}\"}}{{ \\"}}]}},"jsonrpc":"2.0","id":42}}"#,
            "x".repeat(200)
        );
        let input = format!("{{\"a\":1}}\r\n{big}\nnot utf8 \u{fffd}\n{{\"b\":2}}\nlast");
        for chunk in [1, 7, 64, 4096] {
            let mut codec = Lines::new(100);
            let lines = decode_all(&mut codec, input.as_bytes(), chunk);
            assert_eq!(
                lines,
                vec![
                    Line::Text("{\"a\":1}".into()),
                    Line::TooLong { bytes: big.len(), id: Some(42), has_method: false },
                    Line::Text("not utf8 \u{fffd}".into()),
                    Line::Text("{\"b\":2}".into()),
                    Line::Text("last".into()),
                ],
                "chunk {chunk}"
            );
        }
    }

    /// The bound is on a line's text: one of exactly `max` bytes is read whether it ends in `\n` or `\r\n`, and one
    /// byte more is too long either way (before, `max` bytes and `\r\n` were counted too long).
    #[test]
    fn the_bound_is_on_the_text_not_its_line_ending() {
        let exact = "y".repeat(100);
        let over = "z".repeat(101);
        for ending in ["\n", "\r\n"] {
            for chunk in [1, 50, 4096] {
                let input = format!("{exact}{ending}{over}{ending}{{}}{ending}");
                let lines = decode_all(&mut Lines::new(100), input.as_bytes(), chunk);
                let over_bytes = if ending == "\n" { 101 } else { 102 };
                assert_eq!(
                    lines,
                    vec![
                        Line::Text(exact.clone()),
                        Line::TooLong { bytes: over_bytes, id: None, has_method: false },
                        Line::Text("{}".into()),
                    ],
                    "{ending:?} in chunks of {chunk}"
                );
            }
        }
    }

    /// A line of a megabyte read in pieces is the same line, and the read buffer never holds more than a piece:
    /// the line is gathered beside it and put together at its own size.
    #[test]
    fn a_long_line_is_gathered_beside_a_small_read_buffer() {
        let long = format!(r#"{{"jsonrpc":"2.0","id":3,"result":{{"text":"{}"}}}}"#, "é".repeat(500_000));
        let input = format!("{long}\r\n{{}}\n{long}");
        let mut codec = Lines::new(16 * 1024 * 1024);
        let (mut buf, mut lines, mut largest) = (BytesMut::new(), Vec::new(), 0);
        for piece in input.as_bytes().chunks(8 * 1024) {
            buf.extend_from_slice(piece);
            while let Some(line) = codec.decode(&mut buf).expect("decode") {
                lines.push(line);
            }
            largest = largest.max(buf.len());
        }
        while let Some(line) = codec.decode_eof(&mut buf).expect("decode_eof") {
            lines.push(line);
        }
        assert_eq!(lines, vec![Line::Text(long.clone()), Line::Text("{}".into()), Line::Text(long.clone())]);
        assert!(largest <= SPILL_BYTES + 8 * 1024, "the read buffer held {largest} bytes");
    }

    /// A gathered line that turns out too long is skipped and reported like any other, with its id.
    #[test]
    fn a_gathered_line_past_the_bound_is_reported_with_its_id() {
        let big = format!(r#"{{"id":9,"result":"{}"}}"#, "x".repeat(300));
        for chunk in [1, 7, 40] {
            let lines = decode_all(&mut Lines::new(200), format!("{big}\nok\n").as_bytes(), chunk);
            let expected =
                vec![Line::TooLong { bytes: big.len(), id: Some(9), has_method: false }, Line::Text("ok".into())];
            assert_eq!(lines, expected, "chunk {chunk}");
        }
    }

    /// Bytes that are not UTF-8 do not end the stream: the line is read with U+FFFD for them.
    #[test]
    fn bytes_that_are_not_utf8_are_read_with_a_replacement_character() {
        let mut codec = Lines::new(100);
        let lines = decode_all(&mut codec, b"ab\xff\xfecd\n{}\n", 3);
        assert_eq!(lines, vec![Line::Text("ab\u{fffd}\u{fffd}cd".into()), Line::Text("{}".into())]);
    }

    /// A line within the bound whose bad bytes would take it past the bound as text (each becomes a three-byte
    /// U+FFFD) is too long, with its id; one that stays within it is read. Before, 100 bad bytes became 300 bytes
    /// of text under a bound of 100.
    #[test]
    fn bad_bytes_do_not_take_a_line_past_the_bound() {
        let mut grows = br#"{"jsonrpc":"2.0","id":5,"result":""#.to_vec();
        grows.extend(std::iter::repeat_n(0xff, 60));
        grows.extend(b"\"}\n");
        let mut fits = b"ab".to_vec();
        fits.extend(std::iter::repeat_n(0xff, 30));
        fits.push(b'\n');
        for chunk in [1, 16, 4096] {
            let lines = decode_all(&mut Lines::new(100), &[grows.clone(), fits.clone()].concat(), chunk);
            assert_eq!(lines.len(), 2, "chunk {chunk}");
            // As text: each of the 60 bad bytes is three.
            let as_text = grows.len() - 1 + 60 * 2;
            assert_eq!(lines[0], Line::TooLong { bytes: as_text, id: Some(5), has_method: false }, "chunk {chunk}");
            assert_eq!(lines[1], Line::Text(format!("ab{}", "\u{fffd}".repeat(30))), "chunk {chunk}");
            // A log line (stderr's, unscanned) is kept, cut at the bound on a character's edge.
            let logged = decode_all(&mut Lines::unscanned(100), &grows, chunk);
            let [Line::Text(text)] = &logged[..] else { panic!("one line of text: {logged:?}") };
            assert!(text.len() <= 100 && text.len() > 90 && text.starts_with(r#"{"jsonrpc""#), "{text:?}");
        }
    }

    /// The scan takes only the top-level `id`, wherever it stands, and says whether the line was a request.
    #[test]
    fn the_scan_finds_the_top_level_id_only() {
        let cases: [(&str, Option<i64>, bool); 7] = [
            (r#"{"jsonrpc":"2.0","id":7,"result":{"id":3}}"#, Some(7), false),
            (r#"{"result":{"id":3,"list":[{"id":4}]},"jsonrpc":"2.0", "id" : -12 }"#, Some(-12), false),
            (r#"{"result":"\"id\":5,","id":"s"}"#, None, false),
            (r#"{"jsonrpc":"2.0","id":8,"method":"sampling/createMessage","params":{}}"#, Some(8), true),
            (r#"{"jsonrpc":"2.0","method":"notifications/message","params":{"id":1}}"#, None, true),
            (r#"{"idx":1,"result":{}}"#, None, false),
            (r#"[{"id":1}]"#, None, false),
        ];
        for (text, id, has_method) in cases {
            let mut scan = IdScan::default();
            for piece in text.as_bytes().chunks(3) {
                scan.feed(piece);
            }
            assert_eq!((scan.id, scan.has_method), (id, has_method), "{text}");
        }
    }
}
