pub fn run(_json: bool) -> anyhow::Result<()> { Ok(()) }
