//! Escaping for the domain and volume XML this crate writes by hand.
//!
//! Everything that reaches libvirt's XML parser from a Kubernetes object (names,
//! paths, pool and network names, MAC addresses) goes through [`escape`], so no value
//! can close an element or an attribute or inject markup.

/// Escapes `value` for use in XML text or in a single- or double-quoted attribute.
///
/// Characters XML 1.0 cannot represent at all (C0 controls other than tab, newline
/// and carriage return, lone surrogates cannot occur in `str`, U+FFFE/U+FFFF) become
/// U+FFFD, so the output always parses.
pub fn escape(value: &str) -> String {
    let mut out = String::with_capacity(value.len());
    for c in value.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&apos;"),
            // Attribute values normalise whitespace; character references keep it.
            '\t' => out.push_str("&#9;"),
            '\n' => out.push_str("&#10;"),
            '\r' => out.push_str("&#13;"),
            c if is_xml_char(c) => out.push(c),
            _ => out.push('\u{FFFD}'),
        }
    }
    out
}

/// Whether XML 1.0 allows `c` in a document.
pub fn is_xml_char(c: char) -> bool {
    matches!(c, '\t' | '\n' | '\r' | '\u{20}'..='\u{D7FF}' | '\u{E000}'..='\u{FFFD}' | '\u{10000}'..)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn escapes_markup() {
        assert_eq!(
            escape(r#"a<b>&"c"'d'"#),
            "a&lt;b&gt;&amp;&quot;c&quot;&apos;d&apos;"
        );
        assert_eq!(escape("x\u{1}y"), "x\u{FFFD}y");
    }

    proptest! {
        /// Any string, escaped into an attribute and into text, parses back to itself
        /// (with the characters XML cannot carry replaced) and adds no element.
        #[test]
        fn escaped_values_round_trip(value in any::<String>()) {
            let doc = format!("<r a='{0}' b=\"{0}\">{0}</r>", escape(&value));
            let parsed = roxmltree::Document::parse(&doc).expect("escaped XML parses");
            let root = parsed.root_element();
            let want: String = value
                .chars()
                .map(|c| if is_xml_char(c) { c } else { '\u{FFFD}' })
                .collect();
            prop_assert_eq!(root.attribute("a"), Some(want.as_str()));
            prop_assert_eq!(root.attribute("b"), Some(want.as_str()));
            prop_assert_eq!(root.text().unwrap_or(""), want.as_str());
            prop_assert_eq!(root.children().filter(|n| n.is_element()).count(), 0);
        }
    }
}
