//! The small XML layer: escaping and a writer for requests, and an owned element tree
//! (parsed with roxmltree) for responses. vim25 needs nothing more: no schemas, no
//! namespaces beyond `xsi:type`, no mixed content.

use std::borrow::Cow;
use std::fmt::Write as _;

/// Escapes text for element content and attribute values. Characters XML 1.0 cannot
/// carry at all (most C0 controls) become U+FFFD; `\r` is written as `&#13;` so a
/// parser's end-of-line normalisation does not turn it into `\n`.
pub fn escape(text: &str) -> Cow<'_, str> {
    if !text.chars().any(needs_escape) {
        return Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(text.len() + 16);
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&apos;"),
            '\r' => out.push_str("&#13;"),
            c if !is_xml_char(c) => out.push('\u{FFFD}'),
            c => out.push(c),
        }
    }
    Cow::Owned(out)
}

fn needs_escape(c: char) -> bool {
    matches!(c, '&' | '<' | '>' | '"' | '\'' | '\r') || !is_xml_char(c)
}

/// XML 1.0 `Char`: what a document may contain at all.
pub fn is_xml_char(c: char) -> bool {
    matches!(c, '\t' | '\n' | '\r' | '\u{20}'..='\u{D7FF}' | '\u{E000}'..='\u{FFFD}' | '\u{10000}'..)
}

/// Builds a request body element by element. Element names are trusted constants;
/// text always goes through [`escape`].
#[derive(Clone, Debug, Default)]
pub struct Xml(String);

impl Xml {
    /// An empty buffer.
    pub fn new() -> Self {
        Self::default()
    }

    /// `<name>`.
    pub fn open(&mut self, name: &str) -> &mut Self {
        let _ = write!(self.0, "<{name}>");
        self
    }

    /// `<name xsi:type="ty">`: a value of a derived type where the schema names its base.
    pub fn open_typed(&mut self, name: &str, ty: &str) -> &mut Self {
        let _ = write!(self.0, "<{name} xsi:type=\"{}\">", escape(ty));
        self
    }

    /// `</name>`.
    pub fn close(&mut self, name: &str) -> &mut Self {
        let _ = write!(self.0, "</{name}>");
        self
    }

    /// `<name>text</name>`.
    pub fn text(&mut self, name: &str, text: impl std::fmt::Display) -> &mut Self {
        let text = text.to_string();
        let _ = write!(self.0, "<{name}>{}</{name}>", escape(&text));
        self
    }

    /// `<name xsi:type="ty">text</name>`.
    pub fn typed_text(&mut self, name: &str, ty: &str, text: &str) -> &mut Self {
        let _ = write!(
            self.0,
            "<{name} xsi:type=\"{}\">{}</{name}>",
            escape(ty),
            escape(text)
        );
        self
    }

    /// A managed object reference: `<name type="Type">value</name>`.
    pub fn moref(&mut self, name: &str, moref: &MoRef) -> &mut Self {
        let _ = write!(
            self.0,
            "<{name} type=\"{}\">{}</{name}>",
            escape(&moref.kind),
            escape(&moref.value)
        );
        self
    }

    /// Writes a parsed element back (read-modify-write of vSphere data objects such
    /// as devices): its `xsi:type`, other attributes, text and children, in order.
    pub fn element(&mut self, name: &str, element: &Element) -> &mut Self {
        let _ = write!(self.0, "<{name}");
        if let Some(ty) = &element.xsi_type {
            let _ = write!(self.0, " xsi:type=\"{}\"", escape(ty));
        }
        for (k, v) in &element.attributes {
            let _ = write!(self.0, " {k}=\"{}\"", escape(v));
        }
        self.0.push('>');
        if element.children.is_empty() {
            self.0.push_str(&escape(&element.text));
        }
        for child in &element.children {
            self.element(&child.name, child);
        }
        let _ = write!(self.0, "</{name}>");
        self
    }

    /// The XML written so far.
    pub fn finish(self) -> String {
        self.0
    }
}

/// A managed object reference (`type` + value), e.g. `VirtualMachine:vm-42`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct MoRef {
    /// The managed object type, e.g. `VirtualMachine`.
    pub kind: String,
    /// Its ID, e.g. `vm-42`.
    pub value: String,
}

impl MoRef {
    /// A reference.
    pub fn new(kind: impl Into<String>, value: impl Into<String>) -> Self {
        Self {
            kind: kind.into(),
            value: value.into(),
        }
    }
}

impl std::fmt::Display for MoRef {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}:{}", self.kind, self.value)
    }
}

/// One parsed element: local name, `xsi:type`, other attributes by local name, text,
/// children. Owned, so responses outlive their bytes.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Element {
    /// Local name (namespace prefix dropped).
    pub name: String,
    /// The `xsi:type` attribute's local part, when present.
    pub xsi_type: Option<String>,
    /// Other attributes, by local name.
    pub attributes: Vec<(String, String)>,
    /// Concatenated text content of this element (not of its children).
    pub text: String,
    /// Child elements, in order.
    pub children: Vec<Element>,
}

const XSI: &str = "http://www.w3.org/2001/XMLSchema-instance";

impl Element {
    /// Parses a document and returns its root element.
    pub fn parse(xml: &str) -> Result<Self, String> {
        let doc = roxmltree::Document::parse(xml).map_err(|e| e.to_string())?;
        Ok(Self::from_node(doc.root_element()))
    }

    fn from_node(node: roxmltree::Node<'_, '_>) -> Self {
        let mut element = Element {
            name: node.tag_name().name().to_string(),
            ..Default::default()
        };
        for a in node.attributes() {
            if a.name() == "type" && a.namespace() == Some(XSI) {
                // `xsd:string`, `vim25:OptionValue`: keep the local part.
                let v = a.value();
                element.xsi_type = Some(v.rsplit(':').next().unwrap_or(v).to_string());
            } else {
                element
                    .attributes
                    .push((a.name().to_string(), a.value().to_string()));
            }
        }
        for child in node.children() {
            if child.is_element() {
                element.children.push(Self::from_node(child));
            } else if child.is_text() {
                element.text.push_str(child.text().unwrap_or_default());
            }
        }
        element
    }

    /// The first child named `name`.
    pub fn child(&self, name: &str) -> Option<&Element> {
        self.children.iter().find(|c| c.name == name)
    }

    /// Every child named `name`.
    pub fn children_named<'a>(&'a self, name: &'a str) -> impl Iterator<Item = &'a Element> {
        self.children.iter().filter(move |c| c.name == name)
    }

    /// The element at a path of child names.
    pub fn at(&self, path: &[&str]) -> Option<&Element> {
        path.iter().try_fold(self, |e, name| e.child(name))
    }

    /// The text at a path of child names.
    pub fn text_at(&self, path: &[&str]) -> Option<&str> {
        self.at(path).map(|e| e.text.as_str())
    }

    /// An attribute by local name.
    pub fn attribute(&self, name: &str) -> Option<&str> {
        self.attributes
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }

    /// This element as a managed object reference (`type` attribute + text).
    pub fn as_moref(&self) -> Option<MoRef> {
        Some(MoRef::new(self.attribute("type")?, self.text.trim()))
    }

    /// A child element with text, e.g. `<deviceName>VM Network</deviceName>`.
    pub fn leaf(name: &str, text: impl Into<String>) -> Self {
        Self {
            name: name.into(),
            text: text.into(),
            ..Default::default()
        }
    }

    /// Mutable access to the first child named `name`.
    pub fn child_mut(&mut self, name: &str) -> Option<&mut Element> {
        self.children.iter_mut().find(|c| c.name == name)
    }

    /// The first descendant (depth first, self included) named `name`.
    pub fn find(&self, name: &str) -> Option<&Element> {
        if self.name == name {
            return Some(self);
        }
        self.children.iter().find_map(|c| c.find(name))
    }
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
        assert!(matches!(escape("plain"), Cow::Borrowed(_)));
        assert_eq!(escape("a\u{0}b"), "a\u{FFFD}b");
        assert_eq!(escape("a\r\nb"), "a&#13;\nb");
    }

    #[test]
    fn elements_are_written_back_as_read() {
        let doc = r#"<r xmlns:xsi="http://www.w3.org/2001/XMLSchema-instance"><d xsi:type="VirtualE1000"><key>4000</key><n type="Network">network-7</n><s>a&amp;b</s></d></r>"#;
        let e = Element::parse(doc).unwrap();
        let mut x = Xml::new();
        x.element("device", e.child("d").unwrap());
        assert_eq!(
            x.finish(),
            r#"<device xsi:type="VirtualE1000"><key>4000</key><n type="Network">network-7</n><s>a&amp;b</s></device>"#
        );
    }

    #[test]
    fn parses_types_and_morefs() {
        let e = Element::parse(
            r#"<r xmlns:xsi="http://www.w3.org/2001/XMLSchema-instance"><v xsi:type="xsd:string">x</v><m type="VirtualMachine">vm-1</m></r>"#,
        )
        .unwrap();
        assert_eq!(e.child("v").unwrap().xsi_type.as_deref(), Some("string"));
        assert_eq!(
            e.child("m").unwrap().as_moref(),
            Some(MoRef::new("VirtualMachine", "vm-1"))
        );
    }

    proptest! {
        /// Any string a document can carry survives escape → parse unchanged, in text
        /// and in attributes.
        #[test]
        fn escaping_round_trips(s in any::<String>().prop_filter("XML chars", |s| s.chars().all(is_xml_char))) {
            let mut x = Xml::new();
            x.text("v", &s).moref("m", &MoRef::new(s.clone(), "x"));
            let doc = format!("<r>{}</r>", x.finish());
            let e = Element::parse(&doc).unwrap();
            prop_assert_eq!(&e.child("v").unwrap().text, &s);
            prop_assert_eq!(e.child("m").unwrap().attribute("type").unwrap(), s.as_str());
        }

        /// Any string at all yields a well-formed document (invalid characters replaced).
        #[test]
        fn escaping_is_always_well_formed(s in any::<String>()) {
            let mut x = Xml::new();
            x.text("v", &s);
            let doc = format!("<r>{}</r>", x.finish());
            prop_assert!(Element::parse(&doc).is_ok());
        }
    }
}
