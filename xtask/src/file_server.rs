//! A one-file HTTP server on 127.0.0.1 for the wasm tests: the browser fetches the real model
//! from it as a page fetches a model from a CDN (cross-origin, so it answers with CORS).

use std::io::{BufRead, BufReader, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};

/// Serves `file` at `/model.gguf` on an ephemeral port until the process exits; returns its URL.
pub fn serve(file: &Path) -> anyhow::Result<String> {
    let listener = TcpListener::bind("127.0.0.1:0")?;
    let url = format!("http://{}/model.gguf", listener.local_addr()?);
    let file = file.to_path_buf();
    std::thread::spawn(move || {
        for stream in listener.incoming().flatten() {
            let file = file.clone();
            std::thread::spawn(move || {
                if let Err(e) = answer(stream, &file) {
                    eprintln!("file server: {e}");
                }
            });
        }
    });
    Ok(url)
}

fn answer(mut stream: TcpStream, file: &PathBuf) -> std::io::Result<()> {
    let mut reader = BufReader::new(stream.try_clone()?);
    let mut request_line = String::new();
    reader.read_line(&mut request_line)?;
    // Drain the headers; nothing in them changes the answer.
    let mut line = String::new();
    while reader.read_line(&mut line)? > 2 {
        line.clear();
    }
    let cors = "Access-Control-Allow-Origin: *\r\nAccess-Control-Allow-Headers: *\r\n";
    let mut parts = request_line.split_whitespace();
    let (method, path) = (parts.next().unwrap_or(""), parts.next().unwrap_or(""));
    match (method, path) {
        ("OPTIONS", _) => write!(stream, "HTTP/1.1 204 No Content\r\n{cors}\r\n"),
        ("GET", "/model.gguf") => {
            let mut f = std::fs::File::open(file)?;
            let len = f.metadata()?.len();
            write!(
                stream,
                "HTTP/1.1 200 OK\r\n{cors}Content-Type: application/octet-stream\r\n\
                 Content-Length: {len}\r\nConnection: close\r\n\r\n"
            )?;
            std::io::copy(&mut f, &mut stream).map(|_| ())
        }
        _ => write!(
            stream,
            "HTTP/1.1 404 Not Found\r\n{cors}Content-Length: 0\r\nConnection: close\r\n\r\n"
        ),
    }
}
