#!/usr/bin/perl
# A deliberately naive HTTP/1.1 backend for the request-smuggling probes (tests/security/test_ingress_smuggling.py),
# run inside a sandbox (perl-base only). It is the kind of app smuggling works against:
#   - it trusts Content-Length over Transfer-Encoding when a request carries both (the classic CL.TE victim);
#   - it reads chunk sizes with hex(), so "zz" is a last chunk and what follows is a new request;
#   - it takes any "Name: value" line, folded or not, and keeps every Host header.
# So whatever the proxy lets through unnormalised shows up here as a second request.
#
# Every byte received is appended to /tmp/raw.log; every request parsed is appended to /tmp/requests.log as
#   <client port>\t<request line>\thost=<Host values joined by |>\tbody=<body, non-printables as \xNN>
# and answered 200 "seen <request line> body=<n>". Both logs are created empty at start.
use strict;
use warnings;
use IO::Socket::INET;
use Fcntl qw(O_WRONLY O_APPEND O_CREAT O_TRUNC);

my $port = shift || 8000;
for my $log ("/tmp/raw.log", "/tmp/requests.log") { sysopen(my $fh, $log, O_WRONLY | O_CREAT | O_TRUNC) or die "$log: $!"; close $fh; }
my $server = IO::Socket::INET->new(LocalAddr => "0.0.0.0", LocalPort => $port, Listen => 64, ReuseAddr => 1)
    or die "listen: $!";
$SIG{CHLD} = 'IGNORE';
print "listening on $port\n";
while (1) {
    my $client = $server->accept or next;
    my $pid = fork();
    if (!defined $pid) { close $client; next; }
    if ($pid == 0) { close $server; serve($client); exit 0; }
    close $client;
}

my $buf = "";

sub append { my ($path, $data) = @_; sysopen(my $fh, $path, O_WRONLY | O_APPEND | O_CREAT) or return; syswrite($fh, $data); close $fh; }

sub fill {
    my ($c) = @_;
    my $n = sysread($c, my $chunk, 65536);
    return 0 unless $n;
    append("/tmp/raw.log", $chunk);
    $buf .= $chunk;
    return $n;
}

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

sub escape { my ($s) = @_; $s =~ s/([^\x20-\x7e])/sprintf("\\x%02x", ord $1)/ge; return $s; }

sub serve {
    my ($c) = @_;
    my $peer = $c->peerport;
    while (defined(my $head = read_until($c, "\r\n\r\n"))) {
        my ($line) = $head =~ /^([^\r\n]*)/;
        my (%h, @hosts);
        while ($head =~ /^([^:\r\n]+):\s*(.*?)\r?$/mg) { $h{lc $1} = $2; push @hosts, $2 if lc $1 eq "host"; }
        my $body = "";
        if (defined $h{"content-length"}) {
            $body = read_n($c, $h{"content-length"} + 0);
            return unless defined $body;
        } elsif (($h{"transfer-encoding"} || "") =~ /chunked/i) {
            while (1) {
                my $size_line = read_until($c, "\r\n"); return unless defined $size_line;
                my $size = hex($size_line);
                if ($size == 0) { while (defined(my $t = read_until($c, "\r\n"))) { last if $t eq "\r\n"; } last; }
                my $data = read_n($c, $size); return unless defined $data;
                read_n($c, 2);
                $body .= $data;
            }
        }
        append("/tmp/requests.log", "$peer\t" . escape($line) . "\thost=" . escape(join("|", @hosts)) . "\tbody=" . escape($body) . "\n");
        my $answer = "seen " . escape($line) . " body=" . length($body) . "\n";
        my $out = "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: " . length($answer) . "\r\n\r\n$answer";
        while (length $out) { my $w = syswrite($c, $out); return unless $w; $out = substr($out, $w); }
        return if lc($h{"connection"} || "") eq "close";
    }
}
