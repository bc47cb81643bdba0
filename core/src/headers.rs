//! Message headers: ordered, with repeated names, values as bytes.
//!
//! Kept apart from [`crate::event`] so the metadata codec ([`crate::metadata`]) and the event both build on
//! it without depending on each other.

use std::borrow::Cow;

use bytes::Bytes;

/// Ordered message headers; names may repeat and values are arbitrary bytes.
///
/// Names are kept as `Cow<'static, str>` so the SDK's own (static) names cost no allocation per message.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Headers(Vec<(Cow<'static, str>, Bytes)>);

impl Headers {
    /// No headers.
    pub fn new() -> Self {
        Self(Vec::new())
    }

    /// No headers, with room for `n`.
    pub fn with_capacity(n: usize) -> Self {
        Self(Vec::with_capacity(n))
    }

    /// Appends a header (keeping any earlier one of the same name).
    pub fn push(&mut self, name: impl Into<Cow<'static, str>>, value: impl Into<Bytes>) {
        self.0.push((name.into(), value.into()));
    }

    /// Appends a header, builder style.
    pub fn with(mut self, name: impl Into<Cow<'static, str>>, value: impl Into<Bytes>) -> Self {
        self.push(name, value);
        self
    }

    pub(crate) fn entries(&self) -> &[(Cow<'static, str>, Bytes)] {
        &self.0
    }

    /// Every (name, value) pair in order, as owned (cheaply cloned) values.
    pub fn iter_owned(&self) -> impl Iterator<Item = (Cow<'static, str>, Bytes)> + '_ {
        self.0.iter().cloned()
    }

    /// The last value of `name`, if present.
    pub fn get(&self, name: &str) -> Option<&Bytes> {
        self.0.iter().rev().find(|(n, _)| n == name).map(|(_, v)| v)
    }

    /// Every (name, value) pair in order.
    pub fn iter(&self) -> impl Iterator<Item = (&str, &Bytes)> {
        self.0.iter().map(|(n, v)| (n.as_ref(), v))
    }

    /// The number of headers.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Removes every header whose name matches `predicate`.
    pub fn retain(&mut self, mut predicate: impl FnMut(&str, &Bytes) -> bool) {
        self.0.retain(|(n, v)| predicate(n, v));
    }

    /// [`Headers::retain`] with each kept value open to change, in place.
    #[cfg(feature = "opentelemetry")]
    pub(crate) fn retain_mut(&mut self, mut predicate: impl FnMut(&str, &mut Bytes) -> bool) {
        self.0.retain_mut(|(n, v)| predicate(n, v));
    }
}

impl FromIterator<(String, Bytes)> for Headers {
    fn from_iter<I: IntoIterator<Item = (String, Bytes)>>(iter: I) -> Self {
        Self(iter.into_iter().map(|(n, v)| (Cow::Owned(n), v)).collect())
    }
}

impl IntoIterator for Headers {
    type Item = (Cow<'static, str>, Bytes);
    type IntoIter = std::vec::IntoIter<(Cow<'static, str>, Bytes)>;

    fn into_iter(self) -> Self::IntoIter {
        self.0.into_iter()
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn headers_keep_order_and_duplicates() {
        let h = Headers::new()
            .with("a", "1")
            .with("b", Bytes::from_static(&[0, 255]))
            .with("a", "2");
        assert_eq!(h.len(), 3);
        assert_eq!(h.get("a").unwrap().as_ref(), b"2");
        let names: Vec<_> = h.iter().map(|(n, _)| n).collect();
        assert_eq!(names, ["a", "b", "a"]);
    }
}
