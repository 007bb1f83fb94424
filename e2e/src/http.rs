//! A plain HTTP/1.0 GET on loopback: the `/healthz`, `/readyz` and `/metrics` of the fleet's
//! Lifeboat processes, without a client library.

use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// GETs `path` from `127.0.0.1:port`: `Ok(Ok(body))` on 200, `Ok(Err(status line))` otherwise.
pub async fn get(port: u16, path: &str) -> std::io::Result<Result<String, String>> {
    let mut stream = tokio::net::TcpStream::connect(("127.0.0.1", port)).await?;
    stream
        .write_all(format!("GET {path} HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n").as_bytes())
        .await?;
    let mut response = String::new();
    stream.read_to_string(&mut response).await?;
    let (head, body) = response.split_once("\r\n\r\n").unwrap_or((&response, ""));
    Ok(
        if head.starts_with("HTTP/1.0 200") || head.starts_with("HTTP/1.1 200") {
            Ok(body.to_string())
        } else {
            Err(head.lines().next().unwrap_or_default().to_string())
        },
    )
}
