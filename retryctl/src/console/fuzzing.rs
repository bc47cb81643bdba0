//! Entry points for the fuzz targets and their corpus replay; not part of the API.

use std::collections::HashMap;

use axum::extract::Query;
use axum::http::Uri;

use super::handlers::{Form, Selected, to_filter};
use super::pages::FilterForm;

/// A replay or purge form's body as the console reads it: the selection, and the filter it applies
/// when it selects by filter; `Err` with the reason shown to the operator.
pub fn form(body: &[u8]) -> Result<(), String> {
    let selected = Selected::of(&Form::parse(body))?;
    selected.filter().map(drop).map_err(|e| e.to_string())
}

/// A DLQ list page's query (`kind=…&since=…`) as the console reads it: the filter it shows; `Err`
/// with the reason the page shows.
pub fn query(query: &str) -> Result<(), String> {
    let uri: Uri = format!("/dlq/0?{query}")
        .parse()
        .map_err(|e: axum::http::uri::InvalidUri| e.to_string())?;
    let Query(query) =
        Query::<HashMap<String, String>>::try_from_uri(&uri).map_err(|e| e.to_string())?;
    let form = FilterForm::from_fields(|k| query.get(k).cloned().unwrap_or_default());
    to_filter(&form).map(drop).map_err(|e| e.to_string())
}
