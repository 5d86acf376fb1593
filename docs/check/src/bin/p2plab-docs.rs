//! `p2plab-docs bench-tables`: rewrites the generated benchmark tables of
//! every page of `docs/` from the JSON each marker names (see
//! `p2plab_docs::bench`). `--check` only reports which pages differ.

use std::process::ExitCode;

use anyhow::{bail, Context, Result};
use p2plab_docs::{bench, pages, repo::Repo};

fn run(args: &[String]) -> Result<bool> {
    let check = match args {
        [cmd] if cmd == "bench-tables" => false,
        [cmd, flag] if cmd == "bench-tables" && flag == "--check" => true,
        _ => bail!("usage: p2plab-docs bench-tables [--check]"),
    };
    let repo = Repo::this()?;
    let root = repo.root();
    let mut same = true;
    for page in pages(root)? {
        let path = root.join(&page);
        let text = std::fs::read_to_string(&path)
            .with_context(|| format!("reading {}", path.display()))?;
        let new = bench::regenerate(&text, |json| {
            std::fs::read_to_string(root.join(json)).with_context(|| format!("reading {json}"))
        })
        .with_context(|| format!("in {}", page.display()))?;
        if new != text {
            same = false;
            if check {
                println!(
                    "{}: benchmark tables differ from their JSON",
                    page.display()
                );
            } else {
                std::fs::write(&path, new)
                    .with_context(|| format!("writing {}", path.display()))?;
                println!("{}: benchmark tables rewritten", page.display());
            }
        }
    }
    Ok(same || !check)
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match run(&args) {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        Err(e) => {
            eprintln!("p2plab-docs: {e:#}");
            ExitCode::from(2)
        }
    }
}
