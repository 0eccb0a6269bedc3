//! HTTP/1.1 (and 1.0) for static files: request heads in, response heads out, and the
//! per-connection loop that runs each request through its phases.

pub mod conn;
pub mod h2;
pub mod preconditions;
pub mod request;
pub mod response;
pub mod transport;

pub use transport::Transport;

/// A response status code.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Status(pub u16);

impl Status {
    pub const OK: Status = Status(200);
    pub const PARTIAL_CONTENT: Status = Status(206);
    pub const MOVED_PERMANENTLY: Status = Status(301);
    pub const NOT_MODIFIED: Status = Status(304);
    pub const BAD_REQUEST: Status = Status(400);
    pub const FORBIDDEN: Status = Status(403);
    pub const METHOD_NOT_ALLOWED: Status = Status(405);
    pub const REQUEST_TIMEOUT: Status = Status(408);
    pub const LENGTH_REQUIRED: Status = Status(411);
    pub const PRECONDITION_FAILED: Status = Status(412);
    pub const PAYLOAD_TOO_LARGE: Status = Status(413);
    pub const URI_TOO_LONG: Status = Status(414);
    pub const RANGE_NOT_SATISFIABLE: Status = Status(416);
    pub const EXPECTATION_FAILED: Status = Status(417);
    pub const HEADERS_TOO_LARGE: Status = Status(431);
    pub const NOT_IMPLEMENTED: Status = Status(501);
    pub const VERSION_NOT_SUPPORTED: Status = Status(505);

    pub fn reason(self) -> &'static str {
        match self.0 {
            100 => "Continue",
            200 => "OK",
            206 => "Partial Content",
            301 => "Moved Permanently",
            304 => "Not Modified",
            400 => "Bad Request",
            403 => "Forbidden",
            404 => "Not Found",
            405 => "Method Not Allowed",
            408 => "Request Timeout",
            411 => "Length Required",
            412 => "Precondition Failed",
            413 => "Content Too Large",
            414 => "URI Too Long",
            416 => "Range Not Satisfiable",
            417 => "Expectation Failed",
            431 => "Request Header Fields Too Large",
            500 => "Internal Server Error",
            501 => "Not Implemented",
            503 => "Service Unavailable",
            505 => "HTTP Version Not Supported",
            _ => "",
        }
    }
}
