//! Which texts are written in a script without spaces between words (Chinese, Japanese, Korean), whose words the
//! lexical stage cannot match with an English request's, and the other way round.

use super::Keys;

/// Which tools the lexical stage cannot score for a query, because their descriptions and the query are written
/// in different scripts (see [`written_apart`]): a missing lexical score is weak evidence against them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Blind {
    /// None: the query and the tools share a script, or nothing is written apart.
    Nothing,
    /// An English (Latin-script) query: the tools written apart.
    ToApart,
    /// A query written apart: the tools that are not.
    ToTheRest,
}

impl Blind {
    /// For `query`, with `apart_indexed` saying whether any indexed tool is written apart.
    pub(super) fn for_query(query: &str, apart_indexed: bool) -> Blind {
        match (written_apart(query), apart_indexed) {
            (true, _) => Blind::ToTheRest,
            (false, true) => Blind::ToApart,
            (false, false) => Blind::Nothing,
        }
    }

    /// Whether the tool `key` is one the lexical stage is blind to, `apart` being the visible tools written apart.
    pub(super) fn unscored(self, apart: &Keys<'_>, key: &(&str, &str)) -> bool {
        match self {
            Blind::Nothing => false,
            Blind::ToApart => apart.contains(key),
            Blind::ToTheRest => !apart.contains(key),
        }
    }
}

/// Whether `text` is written mostly in a script without spaces between words (Chinese, Japanese; Korean), whose
/// words an English query never shares: three Latin letters count as much as one such character.
pub(super) fn written_apart(text: &str) -> bool {
    let (apart, latin) = letters(text);
    is_written_apart(apart, latin)
}

pub(super) fn is_written_apart(apart: usize, latin: usize) -> bool {
    apart > 0 && apart * 3 > latin
}

/// How many characters of `text` are written apart ([`is_apart`]) and how many are Latin letters.
pub(super) fn letters(text: &str) -> (usize, usize) {
    let (mut apart, mut latin) = (0usize, 0usize);
    for c in text.chars() {
        if c.is_ascii_alphabetic() {
            latin += 1;
        } else if is_apart(c) {
            apart += 1;
        }
    }
    (apart, latin)
}

/// Kana, CJK ideographs (with extension A) and Hangul syllables.
fn is_apart(c: char) -> bool {
    matches!(c, '\u{3040}'..='\u{30ff}' | '\u{3400}'..='\u{4dbf}' | '\u{4e00}'..='\u{9fff}' | '\u{ac00}'..='\u{d7af}')
}
