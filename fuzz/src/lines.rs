//! The input framing the header-list targets share: one header a line, `name:value` (one space after
//! the colon is dropped), a line without a colon a header without a value (Kafka's null header).
//! Values are raw bytes, anything but a newline; names are read as UTF-8, lossily.
//!
//! Plain text so seeds are written by hand and a finding reads as what a broker delivered.

/// The header lines of `data`, in order; an empty line is skipped.
pub fn header_lines(data: &[u8]) -> Vec<(String, Option<Vec<u8>>)> {
    data.split(|&b| b == b'\n')
        .filter(|line| !line.is_empty())
        .map(|line| match line.iter().position(|&b| b == b':') {
            Some(colon) => {
                let value = &line[colon + 1..];
                let value = value.strip_prefix(b" ").unwrap_or(value);
                (
                    String::from_utf8_lossy(&line[..colon]).into_owned(),
                    Some(value.to_vec()),
                )
            }
            None => (String::from_utf8_lossy(line).into_owned(), None),
        })
        .collect()
}

/// `data` cut at the first line `---`: the part before (headers) and the part after (a payload, a
/// body), `None` when there is no such line.
pub fn split_body(data: &[u8]) -> (&[u8], Option<&[u8]>) {
    let mut at = 0;
    for line in data.split(|&b| b == b'\n') {
        if line == b"---" {
            let body = data.get(at + line.len() + 1..).unwrap_or_default();
            return (&data[..at], Some(body));
        }
        at += line.len() + 1;
    }
    (data, None)
}
