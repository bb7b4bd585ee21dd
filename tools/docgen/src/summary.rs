//! The generated block of `SUMMARY.md`: the lines between two marker comments are
//! the generator's; everything else in the file is written by hand.

use anyhow::bail;

/// `summary` with the lines between the markers `<!-- docgen:<block>:begin -->` and
/// `<!-- docgen:<block>:end -->` replaced by `lines`.
pub fn replace_block(summary: &str, block: &str, lines: &[String]) -> anyhow::Result<String> {
    let begin_marker = format!("<!-- docgen:{block}:begin -->");
    let end_marker = format!("<!-- docgen:{block}:end -->");
    let (Some(begin), Some(end)) = (summary.find(&begin_marker), summary.find(&end_marker)) else {
        bail!("SUMMARY.md has no '{begin_marker}' ... '{end_marker}' block");
    };
    if end < begin {
        bail!("SUMMARY.md: '{end_marker}' comes before '{begin_marker}'");
    }
    let mut out = String::with_capacity(summary.len());
    out.push_str(&summary[..begin + begin_marker.len()]);
    out.push('\n');
    for line in lines {
        out.push_str(line);
        out.push('\n');
    }
    out.push_str(&summary[end..]);
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn replaces_only_between_the_markers() {
        let (b, e) = ("<!-- docgen:x:begin -->", "<!-- docgen:x:end -->");
        let summary = format!("# S\n- [A](a.md)\n{b}\n- [old](old.md)\n{e}\n- [Z](z.md)\n");
        let out = replace_block(&summary, "x", &["- [new](new.md)".into()]).unwrap();
        assert_eq!(
            out,
            format!("# S\n- [A](a.md)\n{b}\n- [new](new.md)\n{e}\n- [Z](z.md)\n")
        );
        assert!(replace_block(&summary, "y", &[]).is_err());
    }
}
