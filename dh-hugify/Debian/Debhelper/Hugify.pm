# What the hugify debhelper programs share: the line each ends with, saying how long
# it took, so that hugify's share of a build can be read off any build log (an sbuild
# log on a build service times the build, not its steps).
package Debian::Debhelper::Hugify;

use strict;
use warnings;
use Exporter qw(import);
use File::Basename qw(basename);
use Time::HiRes ();
use Debian::Debhelper::Dh_Lib qw(%dh doit);

our @EXPORT_OK = qw(hugify_doit);

# From the program's start, as near as a module loaded by it gets (perl's start-up
# and Dh_Lib's are a few milliseconds before it).
my $started = Time::HiRes::time();
my $packages = 0;

# Runs a hugify command for one package (Dh_Lib's doit: echoed, fails the build).
sub hugify_doit {
	doit(@_);
	$packages++ if not $dh{NO_ACT};
	return;
}

# "hugify: dh_hugify took 1.23 s for 2 package(s)": the whole program's wall time,
# only when it ran hugify (a build without ELF files, or with nohugify, says nothing).
END {
	if ($packages) {
		my $took = Time::HiRes::time() - $started;
		printf("hugify: %s took %.2f s for %d package(s)\n", basename($0), $took, $packages);
	}
}

1;
