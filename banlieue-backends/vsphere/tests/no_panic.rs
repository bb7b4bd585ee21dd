//! The vSphere backend's SOAP and XML layer never panics on what a vCenter (or a
//! proxy, or a truncated connection) sends back: arbitrary text, and SOAP-shaped
//! documents built from vSphere's own element names with hostile content, through
//! the envelope, fault, property-collector, task and inventory decoders.
//! (`src/client/xml.rs` checks escaping round trips on well-formed documents.)

use banlieue_backend_vsphere::client::soap::{self, Answer};
use banlieue_backend_vsphere::client::xml::is_xml_char;
use banlieue_backend_vsphere::client::{Element, VimFault, methods};
use banlieue_backend_vsphere::inventory;
use proptest::prelude::*;

const NAMES: [&str; 16] = [
    "returnval",
    "objects",
    "obj",
    "propSet",
    "name",
    "val",
    "token",
    "faultcode",
    "faultstring",
    "detail",
    "info",
    "state",
    "error",
    "localizedMessage",
    "ipAddress",
    "key",
];

fn text() -> impl Strategy<Value = String> {
    prop_oneof![
        "(?s:.{0,16})",
        "[a-zA-Z0-9:/_-]{0,12}",
        Just("&amp;&lt;&#x0;&#xFFFF;&unknown;".to_string()),
        Just("10.0.0.1".to_string()),
        Just("]]><![CDATA[".to_string()),
    ]
}

/// A SOAP-ish element tree: vSphere names, `xsi:type`s, hostile text.
fn element() -> impl Strategy<Value = String> {
    let leaf = (proptest::sample::select(NAMES.to_vec()), text()).prop_map(|(n, t)| {
        // Hostile, but a document: only characters XML allows, escaped.
        let t: String = t.chars().filter(|c| is_xml_char(*c)).collect();
        let t = t
            .replace('&', "&amp;")
            .replace('<', "&lt;")
            .replace('>', "&gt;");
        format!("<{n}>{t}</{n}>")
    });
    leaf.prop_recursive(5, 48, 5, |inner| {
        (
            proptest::sample::select(NAMES.to_vec()),
            proptest::option::of(proptest::sample::select(vec![
                "ManagedObjectReference",
                "ArrayOfManagedObjectReference",
                "TaskInfo",
                "ArrayOfString",
                "GuestNicInfo",
                "ArrayOfGuestNicInfo",
                "OptionValue",
                "xsd:string",
                "InvalidLogin",
                "",
            ])),
            proptest::collection::vec(inner, 0..5),
        )
            .prop_map(|(n, ty, children)| {
                let ty = ty
                    .map(|t| format!(" xsi:type=\"{t}\" type=\"{t}\""))
                    .unwrap_or_default();
                format!("<{n}{ty}>{}</{n}>", children.concat())
            })
    })
}

fn envelope() -> impl Strategy<Value = String> {
    (
        proptest::sample::select(vec![
            "RetrievePropertiesExResponse",
            "soapenv:Fault",
            "Fault",
            "LoginResponse",
        ]),
        proptest::collection::vec(element(), 0..4),
    )
        .prop_map(|(first, children)| {
            format!(
                "<soapenv:Envelope xmlns:soapenv=\"http://schemas.xmlsoap.org/soap/envelope/\" \
                 xmlns:xsi=\"http://www.w3.org/2001/XMLSchema-instance\"><soapenv:Body>\
                 <{first}>{}</{first}></soapenv:Body></soapenv:Envelope>",
                children.concat()
            )
        })
}

/// Runs every decoder over `root` and its descendants.
fn decode_everything(root: &Element) {
    let _ = methods::decode_service_content(root);
    let _ = methods::decode_moref(root);
    let (objects, _) = methods::decode_retrieve_result(root);
    for object in &objects {
        let _ = methods::decode_task(object);
        for name in NAMES {
            let _ = (
                object.prop(name),
                object.text(name),
                object.moref(name),
                object.morefs(name),
            );
        }
    }
    let topology = inventory::build(&objects);
    let _ = topology.inventory("vcsim");
    let _ = VimFault::from_soap(root);
    let _ = VimFault::from_detail(Some(root), "message");
    let mut stack = vec![root];
    while let Some(e) = stack.pop() {
        let _ = methods::option_values(e);
        let _ = methods::guest_ips(e);
        stack.extend(e.children.iter());
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    #[test]
    fn arbitrary_text_never_panics(body in "(?s:.{0,200})") {
        let _ = soap::parse_response(&body);
        if let Ok(root) = Element::parse(&body) {
            decode_everything(&root);
        }
    }

    #[test]
    fn soap_shaped_replies_never_panic(body in envelope(), cut in any::<prop::sample::Index>()) {
        match soap::parse_response(&body) {
            Ok(Answer::Response(e)) => decode_everything(&e),
            Ok(Answer::Fault(fault)) => { let _ = format!("{fault:?}"); }
            Err(_) => {}
        }
        let root = Element::parse(&body);
        prop_assert!(root.is_ok(), "generated documents are well-formed: {body}");
        decode_everything(&root.unwrap());
        // A reply cut short (a dropped connection) fails cleanly.
        let mut at = cut.index(body.len());
        while !body.is_char_boundary(at) {
            at -= 1;
        }
        let _ = soap::parse_response(&body[..at]);
    }

    #[test]
    fn failure_domain_names_never_panic(name in text()) {
        if let Some((dc, cluster)) = inventory::parse_failure_domain(&name) {
            let _ = inventory::failure_domain_name(dc, cluster);
        }
    }
}
