//! Prints the token ids of a chat-templated prompt: `cargo run --example tokens -- <model> <text>`.
use straddle_engine::gguf::FileSource;
use straddle_engine::{ChatMessage, Engine, Prompt};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    let e = Engine::load(FileSource::open(&args[1])?, 64)?;
    let msgs = [ChatMessage::new("user", args[2].clone())];
    println!("{:?}", e.template.render(&msgs, true)?);
    println!("{:?}", e.prompt_tokens(Prompt::Messages(&msgs))?);
    Ok(())
}
