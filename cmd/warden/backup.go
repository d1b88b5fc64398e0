package main

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"crypto/sha256"
	"errors"
	"fmt"
	"hash"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/encoding/protojson"

	wardenv1 "github.com/warden-dev/warden/proto/warden/v1"
	"github.com/warden-dev/warden/proto/warden/v1/wardenv1connect"
	"github.com/warden-dev/warden/server"
)

type backupCmd struct {
	Out      string        `required:"" placeholder:"DIR" help:"Directory to write the backup to; it must not exist (its parent must). Holds lease ids and token hashes: keep it as a secret."`
	Deadline time.Duration `default:"30m" help:"How long the backup may take, waiting for a split or move in progress included (the global --timeout does not apply)."`
	Retries  int           `default:"3" help:"How many times to start again when a split or move began during the backup."`
	// Timestamped and Keep serve timers and CronJobs, which have no shell
	// to name each backup or to prune old ones.
	Timestamped bool   `help:"Put the backup in a new directory inside --out (which must exist), named by the time it began: warden-backup-20261206T041500.000Z."`
	Keep        int    `help:"With --timestamped, keep only the newest N warden-backup-* directories in --out once this one succeeded (0: keep all)."`
	SigningKey  string `name:"signing-key" placeholder:"FILE" help:"Sign the manifest (which holds every file's SHA-256) with this private key (warden admin backup-key --out FILE), into manifest.json.sig: wardend restore --verify-key FILE.pub then refuses a backup that anyone without the key changed."`

	key ed25519.PrivateKey // --signing-key's, read before the backup starts
}

// backupKeyCmd is warden admin backup-key.
type backupKeyCmd struct {
	Out string `required:"" placeholder:"FILE" help:"Write the private key to FILE (mode 0600; give it to warden admin backup --signing-key) and the public key to FILE.pub (for wardend restore --verify-key). Neither may exist."`
}

// Run writes a new Ed25519 key pair (server.GenerateBackupKey): the
// private key readable by its owner alone, both created exclusively so
// an existing key is never overwritten.
func (k *backupKeyCmd) Run(g *globals) error {
	private, public, err := server.GenerateBackupKey()
	if err != nil {
		return err
	}
	if err := writeNew(k.Out, private, 0o600); err != nil {
		return fmt.Errorf("backup-key: %w", err)
	}
	if err := writeNew(k.Out+".pub", public, 0o644); err != nil {
		os.Remove(k.Out)
		return fmt.Errorf("backup-key: %w", err)
	}
	pub, _ := server.ParseBackupPublicKey(public)
	fmt.Fprintf(g.out, "backup key %s: private key in %s (keep it secret; warden admin backup --signing-key), public key in %s.pub (wardend restore --verify-key)\n",
		server.KeyID(pub), k.Out, k.Out)
	return nil
}

// writeNew writes b to a new file at path with mode perm, durably.
func writeNew(path string, b []byte, perm os.FileMode) error {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_EXCL|os.O_WRONLY, perm)
	if err != nil {
		return err
	}
	if _, err := f.Write(b); err != nil {
		f.Close()
		return err
	}
	return closeDurably(f)
}

// backupPrefix names the directories --timestamped makes.
const backupPrefix = "warden-backup-"

// prune removes, from dir, all but the newest keep directories that
// --timestamped made (their names sort by time).
func prune(dir string, keep int) error {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return err
	}
	var made []string
	for _, e := range entries {
		if e.IsDir() && strings.HasPrefix(e.Name(), backupPrefix) {
			made = append(made, e.Name())
		}
	}
	slices.Sort(made)
	for _, name := range made[:max(0, len(made)-keep)] {
		if err := os.RemoveAll(filepath.Join(dir, name)); err != nil {
			return err
		}
	}
	return nil
}

// manifestFile is the backup directory's manifest (wardend restore reads
// it: server.ManifestFile).
const manifestFile = "manifest.json"

// Run streams AdminService.Backup into --out: each file as it comes, its
// size and SHA-256 checked against the server's, then manifest.json. A
// failed backup leaves no directory behind.
func (b *backupCmd) Run(g *globals) error {
	parent := b.Out
	switch {
	case b.Keep < 0 || (b.Keep > 0 && !b.Timestamped):
		return usage(errors.New("backup: --keep takes a count of backups, with --timestamped"))
	case b.Timestamped:
		b.Out = filepath.Join(parent, backupPrefix+time.Now().UTC().Format("20060102T150405.000Z"))
	}
	if b.SigningKey != "" {
		pem, err := os.ReadFile(b.SigningKey)
		if err != nil {
			return usage(fmt.Errorf("backup: --signing-key: %w", err))
		}
		if b.key, err = server.ParseBackupPrivateKey(pem); err != nil {
			return usage(fmt.Errorf("backup: --signing-key %s: %w", b.SigningKey, err))
		}
	}
	if err := os.Mkdir(b.Out, 0o700); err != nil {
		return fmt.Errorf("backup: --out: %w", err)
	}
	ctx, cancel := context.WithTimeout(g.root, b.Deadline)
	defer cancel()
	// Backup data is mostly random lease ids: gzip would cost the serving
	// node CPU for little.
	admin := wardenv1connect.NewAdminServiceClient(g.http, g.base, connect.WithAcceptCompression("gzip", nil, nil))
	start := time.Now()
	var man *wardenv1.BackupManifest
	var err error
	for try := 0; ; try++ {
		man, err = b.receive(ctx, admin)
		if connect.CodeOf(err) != connect.CodeAborted || try >= b.Retries {
			break
		}
		if err := os.RemoveAll(b.Out); err != nil {
			return fmt.Errorf("backup: %w", err)
		}
		if err := os.Mkdir(b.Out, 0o700); err != nil {
			return fmt.Errorf("backup: %w", err)
		}
		fmt.Fprintf(os.Stderr, "backup: %v; starting again\n", err)
	}
	if err != nil {
		os.RemoveAll(b.Out)
		return fmt.Errorf("backup: %w", err)
	}
	if b.Keep > 0 {
		if err := prune(parent, b.Keep); err != nil {
			return fmt.Errorf("backup: done in %s, but pruning the older ones: %w", b.Out, err)
		}
	}
	var size int64
	var records uint64
	for _, s := range man.GetShards() {
		size += s.GetFile().GetSize()
		records += s.GetRecords()
	}
	return g.print(man, func(w io.Writer) {
		fmt.Fprintf(w, "backup %s: %d shards, %d records, %d bytes in %s (%s)\n", man.GetBackupId(), len(man.GetShards()), records,
			size+man.GetPlacement().GetSize(), b.Out, time.Since(start).Round(time.Millisecond))
		for _, s := range man.GetShards() {
			fmt.Fprintf(w, "  %-16s shard %d at index %d on node %d, epoch %d, revision %d, %d bytes\n", s.GetFile().GetName(), s.GetShardId(),
				s.GetAppliedIndex(), s.GetNodeId(), s.GetEpoch(), s.GetRevision(), s.GetFile().GetSize())
		}
		fmt.Fprintf(w, "epoch limit %d: a restore takes epochs from %d (or wardend restore --min-epoch)\n", man.GetEpochLimit(), man.GetEpochLimit()+1<<16)
	})
}

// receive runs one Backup call and writes its files into b.Out.
func (b *backupCmd) receive(ctx context.Context, admin wardenv1connect.AdminServiceClient) (*wardenv1.BackupManifest, error) {
	stream, err := admin.Backup(ctx, connect.NewRequest(&wardenv1.BackupRequest{}))
	if err != nil {
		return nil, err
	}
	defer stream.Close()
	var f *os.File
	var h hash.Hash
	var n int64
	written := map[string]bool{}
	defer func() {
		if f != nil {
			f.Close()
		}
	}()
	for stream.Receive() {
		switch m := stream.Msg(); {
		case m.GetFile() != nil:
			name := m.GetFile().GetName()
			if f != nil || name == "" || filepath.Base(name) != name || name == manifestFile || written[name] {
				return nil, fmt.Errorf("the server sent a bad file name %q", name)
			}
			if f, err = os.OpenFile(filepath.Join(b.Out, name), os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600); err != nil {
				return nil, err
			}
			h, n = sha256.New(), 0
		case m.GetEnd() != nil:
			end := m.GetEnd()
			if f == nil || filepath.Base(f.Name()) != end.GetName() {
				return nil, errors.New("the server ended a file it did not start")
			}
			if got := h.Sum(nil); n != end.GetSize() || !bytes.Equal(got, end.GetSha256()) {
				return nil, fmt.Errorf("%s: received %d bytes (SHA-256 %x), the server sent %d (%x)", end.GetName(), n, got, end.GetSize(), end.GetSha256())
			}
			if err := closeDurably(f); err != nil {
				return nil, err
			}
			f, written[end.GetName()] = nil, true
		case m.GetManifest() != nil:
			man := m.GetManifest()
			for _, s := range man.GetShards() {
				if !written[s.GetFile().GetName()] {
					return nil, fmt.Errorf("the manifest lists %s, which the server did not send", s.GetFile().GetName())
				}
			}
			if !written[man.GetPlacement().GetName()] {
				return nil, fmt.Errorf("the manifest lists %s, which the server did not send", man.GetPlacement().GetName())
			}
			text, err := protojson.MarshalOptions{Multiline: true, UseProtoNames: true}.Marshal(man)
			if err != nil {
				return nil, err
			}
			mf, err := os.OpenFile(filepath.Join(b.Out, manifestFile), os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600)
			if err != nil {
				return nil, err
			}
			if _, err := mf.Write(append(text, '\n')); err != nil {
				mf.Close()
				return nil, err
			}
			if err := closeDurably(mf); err != nil {
				return nil, err
			}
			if b.key != nil {
				// The bytes as written: restore verifies the file, not a
				// re-encoding of it.
				if err := writeNew(filepath.Join(b.Out, server.SignatureFile), server.SignManifest(b.key, append(text, '\n')), 0o600); err != nil {
					return nil, err
				}
			}
			d, err := os.Open(b.Out)
			if err != nil {
				return nil, err
			}
			defer d.Close()
			return man, d.Sync()
		default:
			if f == nil {
				return nil, errors.New("the server sent data outside a file")
			}
			k, err := f.Write(m.GetData())
			if err != nil {
				return nil, err
			}
			h.Write(m.GetData())
			n += int64(k)
		}
	}
	if err := stream.Err(); err != nil {
		return nil, err
	}
	return nil, errors.New("the backup stream ended without its manifest")
}

func closeDurably(f *os.File) error {
	if err := f.Sync(); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}
