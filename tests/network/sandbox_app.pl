#!/usr/bin/perl
# A small HTTP/1.1 app for the ingress tests, run inside a debian:13 sandbox (perl-base only).
#   GET  /hello              -> "hello from <hostname> conn=<client port>", keep-alive
#   GET  /stream?n=N&ms=M    -> N chunks "chunk <i>\n", M ms apart (chunked encoding)
#   POST /echo               -> "bytes=<n> sum=<32-bit byte sum>" of the request body
#   GET  /zeros?mib=N        -> N MiB of zero bytes (Content-Length)
#   POST /sink               -> "bytes=<n>" of a Content-Length body (counted, not summed)
#   POST /pingpong           -> each request-body chunk echoed back at once (chunked both ways)
#   GET  /ws (Upgrade)       -> WebSocket echo (Sec-WebSocket-Accept computed with openssl)
#   anything else            -> 404 "app: no route"
use strict;
use warnings;
use IO::Socket::INET;

my $port = shift || 8000;
my $buf = "";
my $server = IO::Socket::INET->new(LocalAddr => "0.0.0.0", LocalPort => $port, Listen => 64, ReuseAddr => 1)
    or die "listen: $!";
$SIG{CHLD} = 'IGNORE';
chomp(my $hostname = `hostname`);
print "listening on $port\n";
while (1) {
    my $client = $server->accept or next;
    my $pid = fork();
    if (!defined $pid) { close $client; next; }
    if ($pid == 0) { close $server; serve($client); exit 0; }
    close $client;
}

sub fill { my ($c) = @_; my $n = sysread($c, my $chunk, 65536); return 0 unless $n; $buf .= $chunk; return $n; }

sub read_until {
    my ($c, $sep) = @_;
    while (1) {
        my $i = index($buf, $sep);
        if ($i >= 0) { my $out = substr($buf, 0, $i + length $sep); $buf = substr($buf, $i + length $sep); return $out; }
        fill($c) or return undef;
    }
}

sub read_n {
    my ($c, $n) = @_;
    while (length $buf < $n) { fill($c) or return undef; }
    my $out = substr($buf, 0, $n); $buf = substr($buf, $n); return $out;
}

sub send_all { my ($c, $data) = @_; while (length $data) { my $w = syswrite($c, $data); return unless $w; $data = substr($data, $w); } }

sub respond {
    my ($c, $status, $body, @headers) = @_;
    send_all($c, "HTTP/1.1 $status\r\nContent-Length: " . length($body) . "\r\n" . join("", map { "$_\r\n" } @headers) . "\r\n$body");
}

sub next_chunk {    # one chunk of a chunked body; undef at the end
    my ($c) = @_;
    my $line = read_until($c, "\r\n"); return undef unless defined $line;
    my ($size) = $line =~ /^([0-9a-fA-F]+)/; $size = hex($size);
    if ($size == 0) { while (defined(my $t = read_until($c, "\r\n"))) { last if $t eq "\r\n"; } return undef; }
    my $data = read_n($c, $size); read_n($c, 2); return $data;
}

sub serve {
    my ($c) = @_;
    my $peer = $c->peerport;
    while (defined(my $head = read_until($c, "\r\n\r\n"))) {
        my ($method, $path) = $head =~ /^(\S+) (\S+)/;
        my %h; while ($head =~ /^([^:\r\n]+):\s*(.*?)\r$/mg) { $h{lc $1} = $2; }
        if ($path eq "/hello") {
            respond($c, "200 OK", "hello from $hostname conn=$peer\n", "Content-Type: text/plain",
                "X-Seen-Forwarded-For: " . ($h{"x-forwarded-for"} || ""), "X-Seen-Host: " . ($h{"host"} || ""));
        } elsif ($path =~ m{^/stream\?n=(\d+)&ms=(\d+)}) {
            my ($n, $ms) = ($1, $2);
            send_all($c, "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nTransfer-Encoding: chunked\r\n\r\n");
            for my $i (1 .. $n) {
                my $line = "chunk $i\n";
                send_all($c, sprintf("%x\r\n%s\r\n", length $line, $line));
                select(undef, undef, undef, $ms / 1000) if $i < $n;
            }
            send_all($c, "0\r\n\r\n");
        } elsif ($path =~ m{^/zeros\?mib=(\d+)}) {
            my $block = "\0" x 1048576;
            send_all($c, "HTTP/1.1 200 OK\r\nContent-Type: application/octet-stream\r\nContent-Length: " . ($1 << 20) . "\r\n\r\n");
            send_all($c, $block) for 1 .. $1;
        } elsif ($path eq "/sink") {
            my ($n, $left) = (0, $h{"content-length"} || 0);
            while ($left > 0) {
                if (!length $buf) { fill($c) or return; }
                my $take = length $buf < $left ? length $buf : $left;
                substr($buf, 0, $take, ""); $n += $take; $left -= $take;
            }
            respond($c, "200 OK", "bytes=$n\n", "Content-Type: text/plain");
        } elsif ($path eq "/echo") {
            my ($n, $sum) = (0, 0);
            if (($h{"transfer-encoding"} || "") =~ /chunked/i) {
                while (defined(my $d = next_chunk($c))) { $n += length $d; $sum = ($sum + unpack("%32C*", $d)) % 4294967296; }
            } else {
                my $left = $h{"content-length"} || 0;
                while ($left > 0) {
                    my $want = $left < 65536 ? $left : 65536;
                    my $d = read_n($c, $want); return unless defined $d;
                    $n += length $d; $left -= length $d; $sum = ($sum + unpack("%32C*", $d)) % 4294967296;
                }
            }
            respond($c, "200 OK", "bytes=$n sum=$sum\n", "Content-Type: text/plain");
        } elsif ($path eq "/pingpong") {
            send_all($c, "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nTransfer-Encoding: chunked\r\n\r\n");
            while (defined(my $d = next_chunk($c))) {
                my $o = "pong:$d";
                send_all($c, sprintf("%x\r\n%s\r\n", length $o, $o));
            }
            send_all($c, "0\r\n\r\n");
        } elsif ($path eq "/ws" && lc($h{"upgrade"} || "") eq "websocket") {
            my $key = $h{"sec-websocket-key"};
            $key =~ s/[^A-Za-z0-9+\/=]//g;
            my $accept = `printf '%s' '${key}258EAFA5-E914-47DA-95CA-C5AB0DC85B11' | openssl sha1 -binary | openssl base64`;
            chomp $accept;
            send_all($c, "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Accept: $accept\r\n\r\n");
            websocket_echo($c);
            return;
        } else {
            respond($c, "404 Not Found", "app: no route\n", "Content-Type: text/plain");
        }
        return if lc($h{"connection"} || "") eq "close";
    }
}

sub websocket_echo {
    my ($c) = @_;
    while (1) {
        my $hdr = read_n($c, 2); return unless defined $hdr;
        my ($b0, $b1) = unpack("CC", $hdr);
        my $opcode = $b0 & 0x0f; my $len = $b1 & 0x7f;
        if ($len == 126) { $len = unpack("n", read_n($c, 2)); } elsif ($len == 127) { $len = unpack("Q>", read_n($c, 8)); }
        my $mask = ($b1 & 0x80) ? read_n($c, 4) : "\0\0\0\0";
        my $data = $len ? read_n($c, $len) : ""; return unless defined $data;
        my $full = $mask x (int($len / 4) + 1);
        $data = $data ^ substr($full, 0, $len);
        my $reply = $opcode == 1 ? "echo:$data" : $data;
        $opcode = 10 if $opcode == 9;  # ping -> pong
        my $rlen = length $reply;
        my $frame = pack("C", 0x80 | $opcode);
        $frame .= $rlen < 126 ? pack("C", $rlen) : $rlen < 65536 ? pack("Cn", 126, $rlen) : pack("CQ>", 127, $rlen);
        send_all($c, $frame . $reply);
        return if $opcode == 8;
    }
}
