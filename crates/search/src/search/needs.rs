//! A request that asks for several things, split into its needs (`discover_mcp_tools` covers each before any is
//! repeated). Pure text rules, no model: a request splits where English marks a new step or question:
//!
//! - line breaks, sentence ends (`.`, `?`, `!`, `;`, `。`, `？`) followed by a space or the end,
//! - numbered questions (`q1:`, `q2:`) and ordinals that start a step (`First,`, `Second,`, `Finally,`),
//! - connectives that start a step: `then`, `and then`, `after that`, `afterwards`, `finally`,
//! - `and` (or `, and`) when the next word is an imperative verb of a tool request (`… and convert …`), never a
//!   bare `and` (`Amazon and Apple` is one need).
//!
//! A part keeps only if it has at least [`MIN_CONTENT_WORDS`] words that are neither stopwords nor the words of
//! asking itself (`answer the following question`, `please help me`): a request splits only when at least two
//! parts keep. Requests of fewer than [`MIN_REQUEST_WORDS`] words (keywords, a single command) never split.

/// Requests shorter than this are one need: `github create issue`, `server tool`, a short command.
const MIN_REQUEST_WORDS: usize = 6;

/// A part with fewer content words than this is not a need of its own ("Return the filename only").
const MIN_CONTENT_WORDS: usize = 2;

/// At most this many needs; the rest of a longer request joins the last one.
pub const MAX_NEEDS: usize = 5;

/// Words that start a new step when they follow `and`.
const STEP_VERBS: &[&str] = &[
    "add",
    "analyze",
    "analyse",
    "book",
    "calculate",
    "check",
    "compare",
    "compile",
    "convert",
    "create",
    "delete",
    "download",
    "draft",
    "draw",
    "edit",
    "email",
    "extract",
    "fetch",
    "find",
    "generate",
    "get",
    "list",
    "look",
    "make",
    "move",
    "open",
    "organize",
    "organise",
    "plot",
    "post",
    "print",
    "read",
    "record",
    "remove",
    "rename",
    "render",
    "run",
    "save",
    "schedule",
    "search",
    "send",
    "share",
    "show",
    "summarize",
    "summarise",
    "tell",
    "translate",
    "update",
    "upload",
    "write",
];

/// Words that begin a step on their own (after a sentence end or a comma).
const STEP_STARTS: &[&str] = &["then", "afterwards", "finally", "lastly"];

/// Ordinals that open a step: `First, …`, `Second, …`.
const ORDINALS: &[&str] = &["first", "second", "third", "fourth", "fifth"];

/// The words of asking, not of what is asked.
const ASKING_WORDS: &[&str] = &[
    "answer",
    "following",
    "question",
    "questions",
    "please",
    "help",
    "tell",
    "give",
    "show",
    "want",
    "need",
    "like",
    "would",
    "could",
    "can",
    "also",
    "let",
    "know",
    "me",
    "us",
    "return",
    "explain",
    "why",
];

/// The needs of `request`, in order: one (the whole request, trimmed) unless it splits into several.
pub fn split_needs(request: &str) -> Vec<String> {
    let request = request.trim();
    if request.split_whitespace().count() < MIN_REQUEST_WORDS {
        return vec![request.to_owned()];
    }
    let mut parts: Vec<String> = pieces(request).into_iter().filter(|part| is_need(part)).collect();
    if parts.len() < 2 {
        return vec![request.to_owned()];
    }
    if parts.len() > MAX_NEEDS {
        let rest = parts.split_off(MAX_NEEDS - 1).join(" ");
        parts.push(rest);
    }
    parts
}

/// The request cut at every boundary the rules name, each piece trimmed of punctuation at its edges.
fn pieces(request: &str) -> Vec<String> {
    let mut parts = Vec::new();
    let mut current: Vec<&str> = Vec::new();
    let mut cut = |current: &mut Vec<&str>| {
        let piece = current.join(" ");
        let piece = piece.trim_matches(|c: char| c.is_whitespace() || matches!(c, ',' | ';' | ':'));
        if !piece.is_empty() {
            parts.push(piece.to_owned());
        }
        current.clear();
    };
    for line in request.lines() {
        let line_words: Vec<&str> = line.split_whitespace().collect();
        for (at, word) in line_words.iter().enumerate() {
            let this = bare(word);
            let previous = at.checked_sub(1).map(|p| line_words[p]);
            let after_comma = previous.is_some_and(|p| p.ends_with(','));
            let starts_step = match this.as_str() {
                b if is_question_number(b) && word.ends_with(':') => true,
                b if STEP_STARTS.contains(&b) => {
                    at == 0 || after_comma || previous.is_some_and(|p| ends_sentence(p) || bare(p) == "and")
                }
                b if ORDINALS.contains(&b) => word.ends_with(',') && (at == 0 || previous.is_some_and(ends_sentence)),
                "and" => line_words.get(at + 1).is_some_and(|next| {
                    let next = bare(next);
                    STEP_VERBS.contains(&next.as_str()) || STEP_STARTS.contains(&next.as_str())
                }),
                _ => false,
            };
            if starts_step {
                cut(&mut current);
                // The connective is not part of the need; an ordinal or a question number is not either.
                continue;
            }
            current.push(word);
            if ends_sentence(word) {
                cut(&mut current);
            }
        }
        cut(&mut current);
    }
    parts
}

/// A word that ends a sentence: `.`, `?`, `!`, `;` or a full-width stop at its end (not `e.g.`, not a path's dot).
fn ends_sentence(word: &str) -> bool {
    let trimmed = word.trim_end_matches(['"', '\'', ')', '`', '”', '’']);
    let Some(last) = trimmed.chars().last() else { return false };
    match last {
        '?' | '!' | ';' | '。' | '？' | '！' => true,
        // "e.g." and "U.S." carry a dot inside; a sentence's last word does not.
        '.' => !trimmed[..trimmed.len() - 1].contains('.') && trimmed.chars().count() > 2,
        _ => false,
    }
}

/// `q1`, `Q2`: a numbered question.
fn is_question_number(word: &str) -> bool {
    let mut chars = word.chars();
    chars.next() == Some('q') && {
        let rest = chars.as_str();
        !rest.is_empty() && rest.chars().all(|c| c.is_ascii_digit())
    }
}

/// The word lowercased, without punctuation at its edges.
fn bare(word: &str) -> String {
    word.trim_matches(|c: char| !c.is_alphanumeric()).to_lowercase()
}

/// A part is a need of its own when enough of its words say what is asked.
fn is_need(part: &str) -> bool {
    let content = part
        .split(|c: char| !c.is_alphanumeric())
        .filter(|word| !word.is_empty())
        .map(str::to_lowercase)
        .filter(|word| !super::analysis::is_stopword(word) && !ASKING_WORDS.contains(&word.as_str()))
        .count();
    content >= MIN_CONTENT_WORDS
}

#[cfg(test)]
mod tests {
    use super::split_needs;

    #[test]
    fn keywords_and_single_commands_are_one_need() {
        for request in [
            "github create issue",
            "server tool",
            "What is the current share price of Apple?",
            "Retrieve free cash flow of Amazon and Apple from the most recent quarterly statement",
        ] {
            assert_eq!(split_needs(request), vec![request.to_owned()], "{request}");
        }
    }

    #[test]
    fn steps_split_at_connectives_and_step_verbs() {
        assert_eq!(
            split_needs("Get deepwiki for vercel/ai and convert its structure to mindmap"),
            ["Get deepwiki for vercel/ai", "convert its structure to mindmap"]
        );
        assert_eq!(
            split_needs("Find the trending GitHub repositories. For the top one, read its Deepwiki. Then, draft a Markdown intro document"),
            ["Find the trending GitHub repositories.", "For the top one, read its Deepwiki.", "draft a Markdown intro document"]
        );
        assert_eq!(
            split_needs(
                "Create a file named config.txt with the content pending, and then edit this file to say complete"
            ),
            ["Create a file named config.txt with the content pending", "edit this file to say complete"]
        );
    }

    #[test]
    fn numbered_questions_split_and_the_asking_is_dropped() {
        let request = "answer the following question:\nq1: What is the station code for Beijing?\nq2: How many train stations are there in Chengdu?";
        assert_eq!(
            split_needs(request),
            ["What is the station code for Beijing?", "How many train stations are there in Chengdu?"]
        );
    }

    #[test]
    fn parts_without_content_join_nothing_and_abbreviations_do_not_end_sentences() {
        // "Return the filename only." has one content word besides the asking: not a need of its own.
        let request =
            "Among all .txt files in the folder, which one has the largest size in bytes? Return the filename.";
        assert_eq!(split_needs(request), vec![request.to_owned()]);
        let request = "Show prices in U.S. dollars for e.g. Apple shares over the last month";
        assert_eq!(split_needs(request), vec![request.to_owned()]);
    }

    #[test]
    fn long_requests_keep_at_most_five_needs() {
        let request = "Read the first file now. Write the second file now. Send the third email now. \
            Plot the fourth chart now. Search the fifth page now. Translate the sixth text now.";
        let needs = split_needs(request);
        assert_eq!(needs.len(), super::MAX_NEEDS);
        assert!(needs[4].contains("fifth") && needs[4].contains("sixth"), "{needs:?}");
    }
}
