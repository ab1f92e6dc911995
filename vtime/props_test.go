package vtime
